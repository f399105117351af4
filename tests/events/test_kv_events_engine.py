"""KV events from a real engine (toy model), decoded by an independent subscriber.

The reference is naive: every block of every sequence the engine ran is cached exactly when
`cache.match` finds all of it. After each wave of requests, the block table the subscriber built
from the events alone must equal that set, salt by salt, whatever evictions, page sizes and
block sizes happened in between.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

import msgpack
import pytest
import zmq
from engine_helpers import make_engine
from kv_subscriber import Subscriber, free_port

from radixkv.engine.engine import Engine
from radixkv.engine.types import RequestOptions, SamplingParams

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
Seq = tuple[str | None, list[int]]


def events_engine(
    layout: str = "map", sub: Subscriber | None = None, **kw: Any
) -> tuple[Engine, Subscriber]:
    """An engine whose PUB connects to a subscriber bound on loopback; replay on loopback. Given
    `sub`, the engine publishes to that subscriber's endpoints (a replica restarted)."""
    if sub is None:
        pub, rep = free_port(), free_port()
        sub = Subscriber(f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{rep}", b"rkv", bind=True)
    assert sub.replay_endpoint is not None
    cfg = {
        "enable_kv_cache_events": True,
        "endpoint": sub.endpoint,
        "replay_endpoint": sub.replay_endpoint,
        "topic": "rkv",
        "layout": layout,
    }
    cfg.update(kw.pop("events", {}))
    return make_engine(kv_events_config=json.dumps(cfg), **kw), sub


def sync(engine: Engine, sub: Subscriber) -> None:
    """Wait until every batch so far is published, then until the subscriber applied them."""
    pub = engine.kv.events.publisher  # type: ignore[attr-defined]
    pub.queue.join()
    sub.drain(until_seq=pub.next_seq - 1)
    assert pub.ledger.orphans == 0


def run(engine: Engine, prompts: list[list[int]], salt: str | None = None) -> list[Seq]:
    opts = RequestOptions(cache_salt=salt)
    outs = engine.generate(prompts, GREEDY, options=opts)
    engine.check_memory()
    return [(salt, list(p) + o.output_token_ids) for p, o in zip(prompts, outs, strict=True)]


def reference(engine: Engine, seqs: list[Seq], block: int) -> set[tuple[str | None, tuple]]:
    out = set()
    assert engine.cache is not None
    for salt, toks in seqs:
        for end in range(block, len(toks) + 1, block):
            if engine.cache.match(toks[:end], salt, record=False).length >= end:
                out.add((salt, tuple(toks[:end])))
    return out


def workload(rng: random.Random, n: int) -> list[list[int]]:
    systems = [[rng.randrange(38) for _ in range(rng.randrange(20, 70))] for _ in range(3)]
    return [
        rng.choice(systems) + [rng.randrange(38) for _ in range(rng.randrange(1, 40))]
        for _ in range(n)
    ]


@pytest.mark.parametrize(
    ("page_size", "block", "layout", "tiers"),
    [
        (16, None, "map", False),
        (1, None, "map", False),
        (4, 8, "map", False),
        (16, None, "tuple", False),
    ],
)
def test_events_match_the_cache(
    page_size: int, block: int | None, layout: str, tiers: bool
) -> None:
    events = {} if block is None else {"block_size": block}
    engine, sub = events_engine(
        layout,
        page_size=page_size,
        num_slots=512,
        events=events,
        chunked_prefill_size=48,
        enable_hierarchical_cache=tiers,
    )
    bs = block or 16
    rng = random.Random(page_size)
    seqs: list[Seq] = []
    try:
        for wave in range(4):
            # Odd waves: no waiting for an in-flight prefix, so requests compute duplicates of
            # pages another one inserts first (the tree keeps the first copy).
            engine.scheduler.defer_min_gain = 10**9 if wave % 2 else 16
            prompts = workload(rng, 8)
            seqs += run(engine, prompts)
            seqs += run(engine, prompts[:3], salt=f"tenant-{wave % 2}")  # same tokens, salted
            sync(engine, sub)
            want = reference(engine, seqs, bs)
            if layout == "map":  # each salt only ever chains through its own blocks
                assert sub.prefixes() == want, f"wave {wave}"
                assert {s for s, _ in want} >= {None, f"tenant-{wave % 2}"}
            else:  # the older layout has no salt field: same blocks, salts not told apart
                assert sorted(t for _, t in sub.prefix_list()) == sorted(t for _, t in want)
        assert engine.scheduler.num_preemptions >= 0
        stats = engine.cache.stats() if engine.cache is not None else {}
        assert len(sub.blocks) * bs < 512 and stats  # the pool was too small: evictions ran
        removed = sum(
            1
            for _, (_, evs, _) in sub.batches
            for e in evs
            if (e["type"] if isinstance(e, dict) else e[0]) == "BlockRemoved"
        )
        assert removed > 0
        assert engine.flush_cache()
        sync(engine, sub)
        assert sub.blocks == {} and sub.clears >= 2  # start-up + flush
        seqs = run(engine, workload(rng, 3))
        sync(engine, sub)
        assert sub.prefixes() == reference(engine, seqs, bs) != set()
    finally:
        engine.close()
        sub.close()


def test_pages_back_from_host_memory_are_announced() -> None:
    """With the host tier (L2), a prefix evicted from the device pool comes back into the tree
    from host memory at admission: announced again as stored, the table still exact."""
    engine, sub = events_engine(page_size=16, num_slots=512, enable_hierarchical_cache=True)
    rng = random.Random(7)
    prompts = [[rng.randrange(38) for _ in range(160)] for _ in range(6)]
    try:
        seqs = run(engine, prompts[:1], salt="a")
        for p in prompts[1:]:  # 5 x 160 tokens through a 512-token pool: the first is evicted
            seqs += run(engine, [p])
        sync(engine, sub)
        first = _chain(prompts[0], "a")
        assert not first <= sub.prefixes()
        seqs += run(engine, prompts[:1], salt="a")
        sync(engine, sub)
        assert engine.tiers is not None and engine.tiers.counters.host_hit_tokens >= 144
        assert first <= sub.prefixes() == reference(engine, seqs, 16)
    finally:
        engine.close()
        sub.close()


def _chain(tokens: list[int], salt: str | None) -> set[tuple[str | None, tuple]]:
    return {(salt, tuple(tokens[:e])) for e in range(16, len(tokens), 16)}


def test_salts_get_distinct_block_ids() -> None:
    engine, sub = events_engine(page_size=16)
    prompt = list(range(38)) + list(range(10))
    try:
        run(engine, [prompt])
        run(engine, [prompt], salt="a")
        run(engine, [prompt], salt="b")
        sync(engine, sub)
        by_salt: dict[str | None, set[int]] = {}
        for h, b in sub.blocks.items():
            by_salt.setdefault(b.salt, set()).add(h)
        assert set(by_salt) == {None, "a", "b"}
        assert len(by_salt[None]) == len(by_salt["a"]) == len(by_salt["b"]) == 3
        assert not (by_salt[None] & by_salt["a"]) and not (by_salt["a"] & by_salt["b"])
        stored = [e for _, (_, evs, _) in sub.batches for e in evs if e["type"] == "BlockStored"]
        first = [e for e in stored if e["parent_block_hash"] is None and e.get("cache_salt")]
        assert all(e["extra_keys"][0] == [e["cache_salt"]] for e in first)
    finally:
        engine.close()
        sub.close()


def test_same_tokens_same_ids_across_engines() -> None:
    """Ids are stable: a second engine (a replica, or this one restarted) names the same blocks
    the same way, and its first batch clears what its previous life announced."""
    rng = random.Random(1)
    prompt = [rng.randrange(38) for _ in range(70)]
    ids = []
    for _ in range(2):
        engine, sub = events_engine(page_size=16)
        try:
            run(engine, [prompt], salt="t")
            sync(engine, sub)
            assert sub.batches[0][1][1] == [{"type": "AllBlocksCleared"}]
            ids.append(set(sub.blocks))
        finally:
            engine.close()
            sub.close()
    assert ids[0] == ids[1] and len(ids[0]) == 4


def test_late_subscriber_recovers_by_replay() -> None:
    """Batches sent before a subscriber connects are lost on PUB/SUB; the replay socket has them."""
    pub, rep = free_port(), free_port()
    cfg = {
        "enable_kv_cache_events": True,
        "endpoint": f"tcp://127.0.0.1:{pub}",
        "replay_endpoint": f"tcp://127.0.0.1:{rep}",
    }
    engine = make_engine(kv_events_config=json.dumps(cfg), page_size=16)
    rng = random.Random(3)
    try:
        seqs = run(engine, workload(rng, 5))  # nobody listens: all of this is dropped
        engine.kv.events.publisher.queue.join()  # type: ignore[attr-defined]
        sub = Subscriber(f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{rep}", bind=True)
        try:
            seqs += run(engine, workload(rng, 3))
            sync(engine, sub)
            assert sub.replayed >= 2  # the start-up clear and the first wave at least
            assert sub.prefixes() == reference(engine, seqs, 16)
            first = sub.batches[0][0]  # the buffer's first batch: the start-up clear
            assert sub.batches[0][1][1] == [{"type": "AllBlocksCleared"}]
            assert [s for s, _ in sub.batches] == list(range(first, first + len(sub.batches)))
            assert sub.holes == 0
        finally:
            sub.close()
    finally:
        engine.close()


def test_a_restarted_publisher_continues_above_its_last_seq() -> None:
    """With `seq_start` "time", a subscriber that keeps its state across a replica's restart
    (the last seq applied, anything not newer dropped) follows the new life: its first batch,
    AllBlocksCleared, comes above the old life's last seq, and the table ends equal to the new
    engine's cache. A stream that started over at 0 (the default, vLLM's) would be dropped."""
    rng = random.Random(7)
    clock = {"seq_start": "time"}
    engine, sub = events_engine(page_size=16, events=clock)
    try:
        run(engine, workload(rng, 3))
        sync(engine, sub)
        old_last = sub.next_seq
        assert old_last is not None and len(sub.blocks) > 0
        engine.close()  # its last AllBlocksCleared may or may not reach the subscriber
        engine, _ = events_engine(page_size=16, sub=sub, events=clock)  # the same endpoints
        seqs = run(engine, workload(rng, 3))
        sync(engine, sub)
        assert sub.next_seq is not None and sub.next_seq > old_last
        first_new = next(b for b in sub.batches if b[0] >= old_last)
        assert first_new[1][1] == [{"type": "AllBlocksCleared"}]
        assert sub.prefixes() == reference(engine, seqs, 16) != set()
    finally:
        engine.close()
        sub.close()


def test_dropped_batches_are_replayed() -> None:
    """A subscriber that loses its connection for a while sees a gap in seq when it is back, and
    fills it from the replay socket: its table equals the cache's again."""
    engine, sub = events_engine(page_size=16, num_slots=512)
    rng = random.Random(5)
    try:
        seqs = run(engine, workload(rng, 4))
        sync(engine, sub)
        before = sub.next_seq
        sub.hang_up()
        seqs += run(engine, workload(rng, 6))  # published to nobody: lost on PUB/SUB
        engine.kv.events.publisher.queue.join()  # type: ignore[attr-defined]
        sub.reopen()
        time.sleep(0.5)  # the publisher reconnects (ZeroMQ retries every 100 ms)
        seqs += run(engine, workload(rng, 2))
        sync(engine, sub)
        assert sub.replayed >= 2 and sub.next_seq > before + 2
        assert sub.prefixes() == reference(engine, seqs, 16)
    finally:
        engine.close()
        sub.close()


def test_replay_from_a_seq_and_end_marker() -> None:
    """A DEALER asking from seq 0 gets what the buffer still holds (its last `buffer_steps`
    batches), then the end marker; a REQ asking past the end gets the end marker alone."""
    engine, sub = events_engine(page_size=16, events={"buffer_steps": 3})
    ctx = zmq.Context()
    try:
        for i in range(6):
            run(engine, [[i] * 40])
        pub = engine.kv.events.publisher  # type: ignore[attr-defined]
        pub.queue.join()
        last = pub.next_seq - 1
        assert last >= 6
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(sub.replay_endpoint or "")
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        got = []
        while True:
            assert dealer.poll(5000)
            _, seq, payload = dealer.recv_multipart()
            got.append(int.from_bytes(seq, "big", signed=True))
            if got[-1] == -1:
                assert payload == b""
                break
            _ts, events, rank = msgpack.unpackb(payload)
            assert rank == 0 and events and events[0]["type"] == "BlockStored"
        assert got == [last - 2, last - 1, last, -1]
        req = ctx.socket(zmq.REQ)
        req.connect(sub.replay_endpoint or "")
        req.send((last + 1).to_bytes(8, "big"))
        assert req.poll(5000)
        assert req.recv_multipart() == [(-1).to_bytes(8, "big", signed=True), b""]
    finally:
        ctx.destroy(linger=0)
        engine.close()
        sub.close()


def test_topic_replay_layout_and_seq_from_zero() -> None:
    """By default a life's seq starts at 0 (vLLM's); `replay_layout` "topic" answers a replay as
    vLLM does now and vllm-router reads: [b"", topic, seq, payload], the end marker's topic
    empty. The subscriber decodes that layout into the same table."""
    engine, sub = events_engine(page_size=16, events={"replay_layout": "topic"})
    sub.replay_layout = "topic"
    ctx = zmq.Context()
    try:
        seqs = run(engine, workload(random.Random(9), 3))
        engine.kv.events.publisher.queue.join()  # type: ignore[attr-defined]
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(sub.replay_endpoint or "")
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        frames = []
        while not frames or frames[-1][2] != (-1).to_bytes(8, "big", signed=True):
            assert dealer.poll(5000)
            frames.append(dealer.recv_multipart())
        assert all(len(f) == 4 and f[0] == b"" for f in frames)
        assert [f[1] for f in frames] == [b"rkv"] * (len(frames) - 1) + [b""]
        seq_list = [int.from_bytes(f[2], "big", signed=True) for f in frames]
        assert seq_list == [*range(len(frames) - 1), -1]
        assert msgpack.unpackb(frames[0][3])[1] == [{"type": "AllBlocksCleared"}]
        sub.replay(0)
        assert sub.prefixes() == reference(engine, seqs, 16) != set()
    finally:
        ctx.destroy(linger=0)
        engine.close()
        sub.close()


def test_events_off_by_default_and_bad_config_fails_start() -> None:
    from radixkv.engine.events.kv_events import NULL_SINK

    assert make_engine().kv.events is NULL_SINK
    assert make_engine(kv_events_config='{"enable_kv_cache_events": false}').kv.events is NULL_SINK
    with pytest.raises(ValueError, match="kv_events_config"):
        make_engine(
            page_size=16,
            kv_events_config='{"enable_kv_cache_events": true, "block_size": 12}',
        )
    with pytest.raises(ValueError, match="cannot open its sockets"):
        make_engine(
            kv_events_config=json.dumps(
                {"enable_kv_cache_events": True, "replay_endpoint": "tcp://999.0.0.1:1"}
            )
        )

"""The tiers pay with default settings on an idle engine (the issue's scenario: a tiny Llama
checkpoint in float32, page 16, 4,000 device slots, 1,500-token prompts, only
`enable_hierarchical_cache` and a storage backend set): a prompt evicted from L1 comes back from
L2; a restarted engine and a second engine on the same Redis get >= 90% of it from L3; outputs
equal a cache-off engine's. And a request held for its storage pages keeps the pages L2 already
had: waiting for L3 never costs an L2 hit."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import GREEDY, make_engine, run_checked
from redis_proc import RedisServer
from tier_helpers import LM, SlowBackend, tier_engine

from radixkv.engine.engine import Engine
from radixkv.engine.types import EngineConfig, SamplingParams

PROMPT_LEN = 1500
SP = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(21)
    return [[rng.randrange(1000, 30000) for _ in range(PROMPT_LEN)] for _ in range(5)]


@pytest.fixture
def tiny(tiny_model_dir: Callable[..., Path]) -> Path:
    return tiny_model_dir("llama", max_position_embeddings=2048)


def engine(path: Path, **kw: Any) -> Engine:
    base = {"num_slots": 4000, "page_size": 16, "dtype": "float32", "device": "cpu", "seed": 0}
    return Engine(str(path), EngineConfig(**{**base, **kw}))


def generate(e: Engine, prompt: list[int]) -> tuple[list[int], int]:
    """One request on an idle engine, the census checked after every step."""
    rid = e.add_request(prompt, SP)
    out: list[int] = []
    cached = -1
    while e.has_unfinished():
        for d in e.step():
            assert d.request_id == rid
            out.extend(d.new_token_ids)
            cached = d.cached_tokens
        e.check_memory()
    return out, cached


_OFF: dict[tuple[str, int], list[int]] = {}


def cache_off(path: Path, prompts: list[list[int]], i: int) -> list[int]:
    if (str(path), i) not in _OFF:
        _OFF[(str(path), i)] = generate(engine(path, disable_radix_cache=True), prompts[i])[0]
    return _OFF[(str(path), i)]


def tiers(kind: str | None, url: str = "") -> dict[str, Any]:
    """The issue's flags: L2 on, an optional L3, every other tier flag at its default."""
    kw: dict[str, Any] = {"enable_hierarchical_cache": True}
    if kind is not None:
        kw.update(hicache_storage_backend=kind, hicache_storage_url=url)
    return kw


@pytest.mark.slow
@pytest.mark.parametrize("storage", [None, "file"])
def test_prompt_evicted_from_l1_comes_back_from_l2(
    tiny: Path, prompts: list[list[int]], tmp_path: Path, storage: str | None
) -> None:
    e = engine(tiny, **tiers(storage, str(tmp_path / "l3")))
    want, cached = generate(e, prompts[0])
    assert cached == 0 and want == cache_off(tiny, prompts, 0)
    for p in prompts[1:4]:  # other traffic: 4,500 more tokens push prompt 0 out of L1
        generate(e, p)
    assert e.cache is not None
    assert e.cache.match(prompts[0][:-1], None, record=False).length == 0  # not in L1
    before = dict(e.metrics().tier_stats)
    got, cached = generate(e, prompts[0])
    assert got == want
    assert cached >= PROMPT_LEN - 16, cached  # every whole page but the last token's
    assert e.metrics().cached_tokens_by_tier["host"] >= PROMPT_LEN - 16
    if storage is not None:  # all of it in L2: nothing asked of L3, no wait considered
        after = e.metrics().tier_stats
        for key in ("prefetch_waited", "prefetch_skipped", "storage_reads_miss"):
            assert after[key] == before[key], key
    e.close()


@pytest.mark.slow
def test_restarted_engine_gets_the_prompt_from_file_storage(
    tiny: Path, prompts: list[list[int]], tmp_path: Path
) -> None:
    flags = tiers("file", str(tmp_path / "l3"))
    a = engine(tiny, **flags)
    want = generate(a, prompts[1])[0]
    assert a.close()  # a clean shutdown flushes the pending L3 writes
    b = engine(tiny, **flags)  # a restart: empty tree, empty L2
    got, cached = generate(b, prompts[1])
    assert got == want == cache_off(tiny, prompts, 1)
    assert cached >= 0.9 * PROMPT_LEN, cached
    s = b.metrics().tier_stats
    assert s["prefetch_waited"] == 1 and s["storage_hit_tokens"] == cached, s
    b.close()


@pytest.mark.slow
def test_second_engine_and_restart_on_one_redis(
    tiny: Path, prompts: list[list[int]], redis_server: RedisServer
) -> None:
    flags = tiers("redis", redis_server.url)
    a = engine(tiny, **flags)
    b = engine(tiny, **flags)  # a second server on the same Redis, idle
    want = generate(a, prompts[2])[0]
    assert a.tiers is not None and a.tiers.worker is not None
    assert a.tiers.worker.drain_writes(10.0)
    got, cached = generate(b, prompts[2])
    assert got == want == cache_off(tiny, prompts, 2)
    assert cached >= 0.9 * PROMPT_LEN, cached
    assert b.metrics().cached_tokens_by_tier["storage"] == cached
    generate(b, prompts[3])  # b measured its prefill and the backend: now it weighs them
    assert b.tiers is not None and b.tiers.worker is not None
    assert b.tiers.worker.drain_writes(10.0)  # b's pages of prompt 3 are in Redis before c asks
    assert a.close()
    c = engine(tiny, **flags)  # a restart of the first one
    got, cached = generate(c, prompts[3])
    assert got == cache_off(tiny, prompts, 3) and cached >= 0.9 * PROMPT_LEN, cached
    for e in (b, c):
        s = e.metrics().tier_stats
        assert s["prefetch_skipped"] == 0 and s["prefetch_timed_out"] == 0, s
        assert s["prefetch_est_prefill_tokens_per_s"] > 0, s
    s = b.metrics().tier_stats  # its second decision weighed the measured estimates
    assert s["prefetch_est_fetch_bytes_per_s"] > 0 and s["prefetch_decided_cheaper"] == 1, s
    b.close()
    c.close()


def test_held_request_keeps_its_l2_pages(tmp_path: Path) -> None:
    """A request whose prefix is in L2 and whose rest is in L3 waits for the fetch (here:
    wait_complete and a backend slow to return values); requests that arrived with it run
    meanwhile and churn L2. Its L2 pages are held for it, so it gets both parts (before: L2
    dropped them while it waited, the chain of page keys broke there, and it hit nothing)."""
    rng = random.Random(5)

    def rand(n: int) -> list[int]:
        return [rng.randrange(38) for _ in range(n)]

    prefix, rest = rand(40), rand(40)
    x = prefix + rest + rand(3)
    flags = {
        "num_slots": 192,  # 48 device pages of 4 tokens
        "hicache_size": 64 * 1024 / 2**20,  # 64 host pages (a toy page weighs 1 KiB)
        "hicache_storage_backend": "file",
        "hicache_storage_url": str(tmp_path / "l3"),
        "hicache_storage_prefetch_policy": "wait_complete",
    }
    want = run_checked(make_engine(LM, disable_radix_cache=True), [x], GREEDY)[0]
    a = tier_engine(**flags)
    run_checked(a, [x], GREEDY)  # L3 now holds x's pages, prefix and rest
    assert a.close()
    e = tier_engine(**flags)
    assert e.tiers is not None and e.tiers.worker is not None
    run_checked(e, [prefix + rand(5)], GREEDY)  # the prefix: in L1 and L2 (write_through)
    run_checked(e, [rand(180)], GREEDY)  # other traffic pushes it out of L1; L2 keeps it
    assert e.cache is not None and e.cache.match(prefix, None, record=False).length == 0
    assert e.tiers.worker.drain_writes(10.0)
    e.tiers.worker.backend = SlowBackend(e.tiers.worker.backend, delay_s=0.5, hits_only=True)
    churn = [e.add_request(rand(60), GREEDY) for _ in range(3)]  # 54 new pages through L2
    rid = e.add_request(x, GREEDY)  # held: its rest comes from L3, slowly
    out: list[int] = []
    cached = -1
    t0 = time.monotonic()
    while e.has_unfinished():
        for d in e.step():
            if d.request_id == rid:
                out.extend(d.new_token_ids)
                cached = d.cached_tokens
        e.check_memory()
        assert time.monotonic() - t0 < 30
    assert len(churn) == 3 and out == want.output_token_ids
    assert cached == 80, cached  # the prefix from L2, the rest from L3
    by_tier = e.metrics().cached_tokens_by_tier
    assert by_tier["host"] >= 40 and by_tier["storage"] >= 40, by_tier
    e.close()

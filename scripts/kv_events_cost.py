#!/usr/bin/env python
"""What KV events cost the step loop: one engine workload with `--kv-events-config` off and on
(a subscriber on loopback drains the stream), interleaved A/B rounds, per-step wall times.

    PYTHONPATH=src .venv/bin/python scripts/kv_events_cost.py [--device cpu] [--page-size 16]

Workload per round: `--requests` prompts of `--prompt-len` tokens sharing a prefix of half their
length, `--max-tokens` greedy tokens each, all submitted at once; a small pool
(`--num-slots`) so later rounds evict earlier ones (stores and removals every round).
Reports per-step wall time (mean and median of decode-only and prefill steps), the time the step
loop spent inside the event hooks (measured around each call), and the publisher thread's busy
time, as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
from typing import Any

import zmq

from radixkv.engine.engine import Engine
from radixkv.engine.types import SamplingParams


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def drain(endpoint: str, stop: threading.Event, counts: dict[str, int]) -> None:
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.bind(endpoint)
    while not stop.is_set():
        if sub.poll(50):
            counts["bytes"] += sum(len(f) for f in sub.recv_multipart())
            counts["batches"] += 1
    sub.close(0)
    ctx.term()


def timed(obj: Any, name: str, acc: list[float]) -> None:
    """Wrap obj.name so each call's duration is added to acc[0]."""
    fn = getattr(obj, name)

    def wrapper(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            acc[0] += time.perf_counter() - t0

    setattr(obj, name, wrapper)


def run_round(engine: Engine, prompts: list[list[int]], sp: SamplingParams) -> dict[str, list]:
    for p in prompts:
        engine.add_request(p, sp)
    decode: list[float] = []
    prefill: list[float] = []
    while engine.has_unfinished():
        waiting = len(engine.scheduler.waiting) + sum(
            r.pending > 1 for r in engine.scheduler.running
        )
        t0 = time.perf_counter()
        engine.step()
        (prefill if waiting else decode).append(time.perf_counter() - t0)
    return {"decode": decode, "prefill": prefill}


def micro(page_size: int, reps: int = 2000) -> dict[str, float]:
    """Best-of-`reps` cost (us) of each step-loop call on its own, no model: announcing one
    512-token insert, one 512-slot eviction, one step's hand-off; and the publisher thread's
    cost of turning that insert into a batch (hashing + msgpack), which is off the loop."""
    import msgpack
    import numpy as np

    from radixkv.engine.events.kv_event_blocks import BlockLedger, encode_batch
    from radixkv.engine.events.kv_events import BlockEventSink

    class Sink:  # stands in for the publisher: keeps nothing
        def put(self, ops: list) -> None:
            return

    sink = BlockEventSink(Sink(), 16 if page_size < 16 else page_size, page_size, None)
    tokens = np.arange(512, dtype=np.int64)
    slots = np.arange(4096, 4096 + 512, dtype=np.int64)

    def best(fn: Any) -> float:
        out = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            out = min(out, time.perf_counter() - t0)
        return 1e6 * out

    res = {
        "stored_512_tokens_us": best(
            lambda: sink.stored(tokens, slots, 0, 512, None, 0)  # type: ignore[arg-type]
        ),
        "removed_512_slots_us": best(lambda: sink.removed(slots)),
        "end_step_us": best(sink.end_step),
    }
    ledger = BlockLedger(sink.block_size, page_size)
    pages = [int(slots[e - 1]) // page_size for e in range(sink.block_size, 513, sink.block_size)]

    def publish() -> None:
        evs = ledger.stored(None, None, pages, tokens)
        msgpack.packb(encode_batch(time.time(), evs, "map"))

    res["thread_batch_512_tokens_us"] = best(publish)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--micro", action="store_true", help="only the per-call costs, no model")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--num-slots", type=int, default=8192)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    if args.micro:
        print(json.dumps({f"page_{p}": micro(p) for p in (1, 16)}, indent=1))
        return
    rng = random.Random(0)
    engines: dict[str, Engine] = {}
    hook_s = {"off": [0.0], "on": [0.0]}
    counts = {"bytes": 0, "batches": 0}
    stop = threading.Event()
    port = free_port()
    thread = threading.Thread(target=drain, args=(f"tcp://127.0.0.1:{port}", stop, counts))
    thread.start()
    busy = [0.0]
    for mode in ("off", "on"):
        cfg = None
        if mode == "on":
            cfg = json.dumps(
                {"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{port}"}
            )
        eng = Engine(
            device=args.device,
            page_size=args.page_size,
            num_slots=args.num_slots,
            kv_events_config=cfg,
        )
        sink = eng.kv.events
        for name in ("stored", "removed", "cleared", "end_step"):
            timed(sink, name, hook_s[mode])
        if mode == "on":
            timed(sink.publisher, "_publish", busy)  # type: ignore[attr-defined]
        engines[mode] = eng
    vocab = int(engines["off"].vocab_size)
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    times: dict[str, dict[str, list[float]]] = {m: {"decode": [], "prefill": []} for m in engines}
    for _ in range(args.rounds):
        shared = [rng.randrange(100, vocab) for _ in range(args.prompt_len // 2)]
        prompts = [
            shared + [rng.randrange(100, vocab) for _ in range(args.prompt_len - len(shared))]
            for _ in range(args.requests)
        ]
        for mode, eng in engines.items():  # same prompts, A then B
            for k, v in run_round(eng, prompts, sp).items():
                times[mode][k] += v
    pub = engines["on"].kv.events.publisher  # type: ignore[attr-defined]
    pub.queue.join()
    time.sleep(0.3)
    stop.set()
    thread.join()
    out: dict[str, Any] = {"args": vars(args)}
    for mode in engines:
        t = times[mode]
        steps = len(t["decode"]) + len(t["prefill"])
        out[mode] = {
            "steps": steps,
            "decode_step_ms_mean": 1e3 * statistics.mean(t["decode"]),
            "decode_step_ms_median": 1e3 * statistics.median(t["decode"]),
            "prefill_step_ms_mean": 1e3 * statistics.mean(t["prefill"]),
            "hook_us_per_step": 1e6 * hook_s[mode][0] / steps,
        }
    out["on"]["publisher_busy_ms_total"] = 1e3 * busy[0]
    out["on"]["batches_published"] = pub.batches_sent
    out["on"]["batches_received"] = counts["batches"]
    out["on"]["bytes_received"] = counts["bytes"]
    for eng in engines.values():
        eng.close()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

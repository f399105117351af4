"""The prefix workload in-process, closed loop, for each --decode-stall-ms value in turn:
`python -m scripts.decode_stall --model DIR --dtype bfloat16 --stalls 0,1000,400 --reps 2`.

vLLM's prefix workload's shape (PREFIXES x PER_PREFIX prompts of a PREFIX_LEN-token shared prefix
plus SUFFIX_LEN unique tokens, OUT tokens each with ignore_eos, CONCURRENCY in flight, a new one
as soon as one finishes), on one Engine whose cache is flushed between runs. Prints duration, mean
TTFT and mean TPOT per run (the values alternate within a rep, so a shared machine's load hits them
alike) and, with --json, writes them.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

from radixkv.engine.engine import Engine
from radixkv.engine.types import SamplingParams


def run_once(e: Engine, stall_ms: float, shape: list[int], seed: int) -> dict[str, float]:
    prefixes, per_prefix, concurrency, out, prefix_len, suffix_len = shape
    e.flush_cache()
    object.__setattr__(e.scheduler.config, "decode_stall_ms", stall_ms)
    e.scheduler.prefill_rate = 0.0  # each run measures its own
    rng = random.Random(seed)
    heads = [[rng.randrange(100, 40000) for _ in range(prefix_len)] for _ in range(prefixes)]
    queue = [h + [rng.randrange(100, 40000) for _ in range(suffix_len)] for h in heads]
    queue = [p for p in queue for _ in range(per_prefix)]
    random.Random(seed + 1).shuffle(queue)
    sp = SamplingParams(max_tokens=out, ignore_eos=True, temperature=0)
    start: dict[str, float] = {}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    count: dict[str, int] = {}

    def submit() -> None:
        rid = e.add_request(queue.pop(), sp)
        start[rid], count[rid] = time.perf_counter(), 0

    t0 = time.perf_counter()
    for _ in range(min(concurrency, len(queue))):
        submit()
    while e.has_unfinished():
        for d in e.step():
            now = time.perf_counter()
            if d.new_token_ids:
                first.setdefault(d.request_id, now)
                last[d.request_id] = now
                count[d.request_id] += len(d.new_token_ids)
            if d.finished and queue:
                submit()
    ttft = [first[r] - start[r] for r in start]
    tpot = [(last[r] - first[r]) / max(1, count[r] - 1) for r in start]
    return {
        "stall_ms": stall_ms,
        "duration_s": time.perf_counter() - t0,
        "mean_ttft_s": statistics.mean(ttft),
        "mean_tpot_s": statistics.mean(tpot),
        "prefill_rate": e.scheduler.prefill_rate,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=None, help="checkpoint dir (default: the embedded model)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--stalls", default="0,1000,400", help="--decode-stall-ms values (ms)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument(
        "--shape",
        default="8,4,4,16,1024,64",
        help="PREFIXES,PER_PREFIX,CONCURRENCY,OUT,PREFIX_LEN,SUFFIX_LEN",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    shape = [int(x) for x in args.shape.split(",")]
    e = Engine(model=args.model, dtype=args.dtype) if args.model else Engine(dtype=args.dtype)
    print(e.kernel_paths(), flush=True)
    rows: list[dict[str, Any]] = []
    for rep in range(args.reps):
        for stall in (float(x) for x in args.stalls.split(",")):
            r = run_once(e, stall, shape, seed=rep) | {"rep": rep}
            rows.append(r)
            print(
                f"rep {rep} stall {stall:6.0f} ms: duration {r['duration_s']:6.1f} s  "
                f"mean TTFT {1000 * r['mean_ttft_s']:7.0f} ms  "
                f"mean TPOT {1000 * r['mean_tpot_s']:6.0f} ms  "
                f"prefill {r['prefill_rate']:.0f} tok/s",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kernel_paths": e.kernel_paths(), "shape": shape, "runs": rows}, f, indent=1)


if __name__ == "__main__":
    main()

"""Does a cold prompt wait out a stream of warm ones under `--schedule-policy lpm`?

Starts `python -m radixkv serve` (the one on PYTHONPATH, so an older checkout can be measured the
same way) on a tiny random Llama checkpoint, float32, `--schedule-policy lpm
--max-running-requests 4`. Then:
- `--clients` warm clients loop for `--duration` seconds, each sending a shared `--prefix`-token
  prompt + 8 new tokens and asking for 24 tokens (ignore_eos);
- `--delay` seconds in, `--cold` cold clients each send one unrelated `--prefix`-token prompt
  (streamed, one chunk per token) and record when its first token arrives.
Warm clients stop at `--duration`; a cold request not served by then shows a TTFT past it.

Prints the mean warm latency, warm throughput and hit rate, and every cold request's time to
first token with its ratio to the mean warm latency (the target is <= 4x).

    python scripts/lpm_starvation.py [--duration 40] [--server-args="--no-compile ..."]

(`--server-args=...` with the `=`: its value starts with a dash.) Run it with an older checkout
on PYTHONPATH for the figures before a change.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from radixkv.bench.serving.server_proc import LocalServer
from radixkv.bench.tiny_model import tiny_llama  # the seeded 2-layer Llama, built once

OUT_TOKENS = 24
NEW_TOKENS = 8


async def warm_request(http: httpx.AsyncClient, url: str, prompt: list[int]) -> dict[str, float]:
    body = {"prompt": prompt, "max_tokens": OUT_TOKENS, "temperature": 0, "ignore_eos": True}
    t0 = time.perf_counter()
    r = await http.post(url + "/v1/completions", json=body)
    r.raise_for_status()
    usage = r.json()["usage"]
    return {
        "start": t0,
        "end": time.perf_counter(),
        "prompt": usage["prompt_tokens"],
        "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
        "out": usage["completion_tokens"],
    }


async def warm_client(
    http: httpx.AsyncClient, url: str, prefix: list[int], rng: random.Random, stop_at: float
) -> list[dict[str, float]]:
    done = []
    while time.perf_counter() < stop_at:
        new = [rng.randrange(100, 40000) for _ in range(NEW_TOKENS)]
        done.append(await warm_request(http, url, prefix + new))
    return done


async def cold_client(http: httpx.AsyncClient, url: str, prompt: list[int]) -> dict[str, float]:
    body = {
        "prompt": prompt,
        "max_tokens": OUT_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "logprobs": 1,  # a chunk for every token, even one whose text is still incomplete
    }
    t0 = time.perf_counter()
    first = None
    async with http.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if first is None and line.startswith("data: {") and '"choices": [{' in line:
                first = time.perf_counter()
    assert first is not None, "no token came back"
    return {"start": t0, "ttft": first - t0, "latency": time.perf_counter() - t0}


async def drive(url: str, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    prefix = [rng.randrange(100, 40000) for _ in range(args.prefix)]
    colds = [[rng.randrange(100, 40000) for _ in range(args.prefix)] for _ in range(args.cold)]
    limits = httpx.Limits(max_connections=args.clients + args.cold + 4)
    async with httpx.AsyncClient(timeout=None, limits=limits) as http:
        # Warm-up (not measured): the shared prefix enters the cache, and a long uncached
        # prompt and short cached ones have run once.
        await warm_request(http, url, [rng.randrange(100, 40000) for _ in range(args.prefix)])
        for i in range(3):
            await warm_request(http, url, prefix + [100 + i] * NEW_TOKENS)
        t0 = time.perf_counter()
        stop_at = t0 + args.duration
        warm = [
            asyncio.create_task(warm_client(http, url, prefix, random.Random(i), stop_at))
            for i in range(args.clients)
        ]
        await asyncio.sleep(args.delay)
        cold = await asyncio.gather(*(cold_client(http, url, p) for p in colds))
        warm_done = [x for batch in await asyncio.gather(*warm) for x in batch]
    # Warm figures over the requests that finished inside the window.
    inside = [x for x in warm_done if x["end"] <= stop_at]
    lat = [x["end"] - x["start"] for x in inside]
    mean_warm = statistics.fmean(lat)
    return {
        "warm_requests": len(inside),
        "warm_mean_latency_s": mean_warm,
        "warm_p99_latency_s": sorted(lat)[int(0.99 * (len(lat) - 1))],
        "warm_hit_rate": sum(x["cached"] for x in inside) / sum(x["prompt"] for x in inside),
        "warm_requests_per_s": len(inside) / args.duration,
        "warm_output_tokens_per_s": sum(x["out"] for x in inside) / args.duration,
        "cold_ttft_s": [c["ttft"] for c in cold],
        "cold_ttft_over_warm": [c["ttft"] / mean_warm for c in cold],
        "cold_served_after_warm_stopped": [c["start"] + c["ttft"] > stop_at for c in cold],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=40.0, help="seconds of warm traffic")
    p.add_argument("--delay", type=float, default=3.0, help="seconds before the cold prompts")
    p.add_argument("--clients", type=int, default=12, help="warm clients")
    p.add_argument("--cold", type=int, default=4, help="cold prompts")
    p.add_argument("--prefix", type=int, default=1200, help="tokens of the shared prefix")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--server-args",
        default="",
        help="more serve flags (after --schedule-policy lpm --max-running-requests 4 "
        "--dtype float32)",
    )
    p.add_argument("--ckpt", default="/tmp/radixkv-tiny-llama-4k", help="checkpoint dir")
    p.add_argument("--log", default=None, help="server log file")
    p.add_argument("--json", default=None, help="write the figures here too")
    args = p.parse_args(argv)

    model = tiny_llama(Path(args.ckpt))
    flags = ["--schedule-policy", "lpm", "--max-running-requests", "4", "--dtype", "float32"]
    flags += shlex.split(args.server_args)
    with LocalServer(str(model), flags, log_path=args.log) as server:
        result = asyncio.run(drive(server.url, args))
    result["server_flags"] = flags
    print(
        f"warm: {result['warm_requests']} requests in {args.duration:.0f} s "
        f"({result['warm_requests_per_s']:.2f}/s, {result['warm_output_tokens_per_s']:.1f} out "
        f"tok/s), mean latency {result['warm_mean_latency_s']:.2f} s, "
        f"p99 {result['warm_p99_latency_s']:.2f} s, hit rate {100 * result['warm_hit_rate']:.1f}%"
    )
    for ttft, ratio, late in zip(
        result["cold_ttft_s"],
        result["cold_ttft_over_warm"],
        result["cold_served_after_warm_stopped"],
        strict=True,
    ):
        note = " (only after the warm stream stopped)" if late else ""
        print(f"cold: first token after {ttft:.2f} s = {ratio:.1f}x the mean warm latency{note}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

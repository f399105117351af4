"""What the server adds to a decode step: the engine's own step time in-process against the
per-token interval an HTTP client sees, with the engine in its own process (the default) and on
a thread of the server process (`--in-process`).

    python scripts/proc_overhead.py [--model DIR] [--threads 2] [--streams 8]
        [--prompt-len 256] [--max-tokens 64] [--modes inproc,process,thread]

Workload: `--streams` concurrent requests, each a distinct random `--prompt-len`-token prompt
(no cache hits), generating `--max-tokens` tokens with ignore_eos, greedy; one warm-up round,
then one measured round. Decode step = the mean time between a stream's consecutive tokens once
every stream has its first token (the client's view), or between Engine.step() calls in which all
streams decode (the engine's own view). A benchmark, run once; on a shared machine it is noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from radixkv.bench.serving.server_proc import LocalServer


def _prompts(n: int, length: int, seed: int, vocab: int = 49152) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab) for _ in range(length)] for _ in range(n)]


def engine_step_ms(args: argparse.Namespace) -> float:
    """Mean Engine.step() time (ms) over the steps in which every stream decodes."""
    import torch

    from radixkv.engine.engine import Engine
    from radixkv.engine.types import EngineConfig, SamplingParams

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine(model=args.model, config=EngineConfig(model=args.model))
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    times: list[float] = []
    for seed in (1, 2):  # warm-up round, measured round
        for p in _prompts(args.streams, args.prompt_len, seed):
            engine.add_request(p, sp)
        times = []
        started: set[str] = set()
        while engine.has_unfinished():
            decoding = len(started) == args.streams
            t0 = time.perf_counter()
            deltas = engine.step()
            dt = time.perf_counter() - t0
            if decoding and len(deltas) == args.streams:
                times.append(dt)
            started.update(d.request_id for d in deltas if d.new_token_ids)
    return 1000 * statistics.mean(times)


async def _stream(client: httpx.AsyncClient, prompt: list[int], n: int) -> list[float]:
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    stamps: list[float] = []
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                stamps.append(time.perf_counter())
    return stamps


async def _round(url: str, prompts: list[list[int]], n: int) -> list[list[float]]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        return list(await asyncio.gather(*(_stream(client, p, n) for p in prompts)))


def client_step_ms(stamps: list[list[float]]) -> float:
    """Mean interval between a stream's token events once every stream has started decoding."""
    all_started = max(s[0] for s in stamps)
    gaps = [b - a for s in stamps for a, b in itertools.pairwise(s) if a >= all_started]
    return 1000 * statistics.mean(gaps)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_step_ms(args: argparse.Namespace, in_process: bool) -> dict[str, float]:
    flags = ["--threads", str(args.threads), "--log-level", "warning"]
    if in_process:
        flags.append("--in-process")
    with LocalServer(args.model, flags) as srv:
        asyncio.run(_round(srv.url, _prompts(args.streams, args.prompt_len, 1), args.max_tokens))
        before = httpx.get(srv.url + "/cache/stats", timeout=60).json()["engine"]
        assert srv.proc is not None
        pids = {"api": srv.proc.pid, "engine": before["pid"]}
        cpu0 = {k: _cpu_seconds(p) for k, p in pids.items()}
        stamps = asyncio.run(
            _round(srv.url, _prompts(args.streams, args.prompt_len, 2), args.max_tokens)
        )
        cpu1 = {k: _cpu_seconds(p) for k, p in pids.items()}
        after = httpx.get(srv.url + "/cache/stats", timeout=60).json()["engine"]
        step = client_step_ms(stamps)
        wall = max(s[-1] for s in stamps) - min(s[0] for s in stamps)
        tokens = sum(len(s) for s in stamps)
    return {
        "client_step_ms": step,
        "decode_tok_s": args.streams * 1000 / step,
        "tokens": tokens,
        # The server's engine over the whole measured round (prefill steps included).
        "server_engine_steps": after["steps"] - before["steps"],
        "server_engine_mean_step_ms": 1000
        * (after["step_seconds"] - before["step_seconds"])
        / max(1, after["steps"] - before["steps"]),
        "wall_s": wall,
        # CPU time (user + sys, all threads) per engine step of the measured round: what each
        # process costs whatever the machine's load (in-process mode: one process, both figures).
        **{
            f"{k}_process_cpu_ms_per_step": 1000
            * (cpu1[k] - cpu0[k])
            / max(1, after["steps"] - before["steps"])
            for k in pids
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--modes", default="inproc,process,thread")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    modes = args.modes.split(",")
    if "inproc" in modes:
        results["engine_in_process_step_ms"] = engine_step_ms(args)
    if "process" in modes:
        results["server_engine_process"] = server_step_ms(args, in_process=False)
    if "thread" in modes:
        results["server_engine_thread"] = server_step_ms(args, in_process=True)
    base = results.get("engine_in_process_step_ms")
    for key in ("server_engine_process", "server_engine_thread"):
        if base and key in results:
            results[key]["vs_engine"] = results[key]["client_step_ms"] / base
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

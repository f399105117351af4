"""`radixkv bench serve`: run one workload against any OpenAI-compatible server and report."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from radixkv.bench.inputs.tokens import TokenSource
from radixkv.bench.inputs.workload_cli import (
    add_workload_args,
    build_workload,
    token_source,
    workloads_help,
)
from radixkv.bench.inputs.workloads import BenchRequest, Workload
from radixkv.bench.serving.client import ClientOptions, RunResult, run_requests
from radixkv.bench.serving.metrics import format_summary, summarize

WARMUP_PROMPT_LEN = 32
WARMUP_MAX_TOKENS = 4


def add_client_args(p: argparse.ArgumentParser) -> None:
    """Load shape and run control, shared with `bench compare`."""
    p.add_argument("--request-rate", type=float, default=None, help="Poisson arrivals per second")
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="max requests in flight (default 8 when neither this, --request-rate, nor trace "
        "arrival times pace the run)",
    )
    p.add_argument("--warmup", type=int, default=2, help="unrelated warm-up requests, not counted")
    p.add_argument("--seed", type=int, default=0, help="workload and arrival seed")
    p.add_argument("--duration-limit", type=float, default=None, help="stop sending after SECONDS")
    p.add_argument("--request-timeout", type=float, default=3600.0, help="per request, seconds")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.add_argument(
        "--no-flush",
        dest="flush",
        action="store_false",
        help="do not ask the server to drop its prefix cache after warm-up",
    )


def client_options(
    args: argparse.Namespace, base_url: str, model: str, wl: Workload
) -> ClientOptions:
    has_arrivals = any(r.arrival_s is not None for r in wl.requests)
    rate = args.request_rate if args.request_rate is not None else math.inf
    conc = args.concurrency
    if conc is None and args.request_rate is None and not has_arrivals:
        conc = 8
    return ClientOptions(
        base_url=base_url,
        model=model,
        api_key=getattr(args, "api_key", None),
        request_rate=rate,
        concurrency=conc,
        use_arrival_times=has_arrivals and args.request_rate is None,
        duration_limit=args.duration_limit,
        seed=args.seed,
        request_timeout=args.request_timeout,
    )


def warmup_requests(tokens: TokenSource, n: int, seed: int) -> list[BenchRequest]:
    """Short random prompts that share nothing (beyond chance) with the measured workload."""
    rng = np.random.default_rng([seed, 0x5EED])
    reqs = []
    for i in range(n):
        ids = tokens.draw(rng, WARMUP_PROMPT_LEN)
        text = tokens.to_text(ids) if tokens.text_mode else None
        reqs.append(BenchRequest(i, ids, WARMUP_MAX_TOKENS, "warmup", prompt_text=text))
    return reqs


async def _flush(base_url: str, api_key: str | None) -> bool:
    """Best effort: our /flush_cache, else vLLM's /reset_prefix_cache. True if one answered 2xx."""
    import aiohttp

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        for path in ("/flush_cache", "/reset_prefix_cache"):
            try:
                async with s.post(base_url.rstrip("/") + path, headers=headers) as r:
                    if r.status < 300:
                        return True
            except aiohttp.ClientError:
                continue
    return False


async def served_model_name(base_url: str, api_key: str | None = None) -> str:
    """The first model id listed by GET /v1/models."""
    import aiohttp

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s,
        s.get(base_url.rstrip("/") + "/v1/models", headers=headers) as r,
    ):
        r.raise_for_status()
        return str((await r.json())["data"][0]["id"])


def run_workload(
    args: argparse.Namespace,
    base_url: str,
    model: str | None,
    workload: Workload,
    tokens: TokenSource,
) -> dict[str, Any]:
    """Warm up, flush, run the workload; the summary + per-request records (JSON-ready)."""

    async def go() -> tuple[str, RunResult, bool]:
        name = model or await served_model_name(base_url, getattr(args, "api_key", None))
        opts = client_options(args, base_url, name, workload)
        warm = warmup_requests(tokens, args.warmup, args.seed)
        if warm:
            await run_requests(warm, ClientOptions(base_url, name, opts.api_key, concurrency=1))
        flushed = bool(args.flush) and await _flush(base_url, opts.api_key)
        bar = None
        if args.progress:
            from tqdm import tqdm

            bar = tqdm(total=len(workload.requests), desc=workload.name, file=sys.stderr)
        try:
            run = await run_requests(workload.requests, opts, bar)
        finally:
            if bar is not None:
                bar.close()
        return name, run, flushed

    name, run, flushed = asyncio.run(go())
    summary = summarize(run.results, run.wall_s, workload.ideal_hit_rate(), run.not_sent)
    opts = client_options(args, base_url, name, workload)
    return {
        "base_url": base_url,
        "model": name,
        "flushed_after_warmup": flushed,
        "load": {
            "request_rate": None if math.isinf(opts.request_rate) else opts.request_rate,
            "concurrency": opts.concurrency,
            "use_arrival_times": opts.use_arrival_times,
            "duration_limit": opts.duration_limit,
            "warmup": args.warmup,
        },
        "workload": workload.describe(),
        "summary": summary,
        "requests": [r.to_dict() for r in run.results],
    }


def _cmd_serve(args: argparse.Namespace) -> int:
    if args.tokenizer is None and args.model and Path(args.model).is_dir():
        args.tokenizer = args.model
    tokens = token_source(args)
    workload = build_workload(args, tokens)
    out = run_workload(args, args.base_url, args.model, workload, tokens)
    out["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out["command"] = " ".join(["radixkv", *sys.argv[1:]])
    print(
        format_summary(out["summary"], f"{workload.name} against {args.base_url} ({out['model']})")
    )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.json}")
    return 0 if out["summary"]["completed"] else 1


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="benchmark any OpenAI-compatible server on a workload",
        description=workloads_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root URL")
    p.add_argument("--model", default=None, help="served model name (default: first of /v1/models)")
    p.add_argument("--api-key", default=None, help="Bearer token, if the server wants one")
    p.add_argument("--json", default=None, help="write summary + per-request records here")
    add_workload_args(p)
    add_client_args(p)
    p.set_defaults(func=_cmd_serve)

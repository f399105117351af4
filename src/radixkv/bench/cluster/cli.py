"""`radixkv bench cluster`: one workload through N replicas behind a real router, per routing
configuration, beside an offline simulation of the same cluster.

Configurations: `round_robin` and `cache_aware` (the SGLang Model Gateway, `smg`), `kv_aware`
(vllm-router, routing on the replicas' KV events), each also with `+l2` (a host-RAM tier in every
replica, announced in its events) and/or `+l3` (one Redis shared by every replica as its L3).
For each, a fresh cluster (`radixkv.cluster.launch`) serves the workload with `--concurrency`
requests in flight; the clients' `cached_tokens` give the cluster hit rate, each
request's session tells which replica served it. The simulation
(`radixkv.bench.cluster.cluster_sim`) replays the same prompts through the same routing with
per-replica page LRUs of the replicas' capacity, and adds one global pool of the summed capacity and
the ideal (an unbounded pool): how close the real cluster gets to one global pool. `--sim-only` runs
the simulation alone.

Workloads: those of `bench serve` (`--workload`); the default is the multi-tenant one the issue
sets its targets on: 6 tenants x 18 requests, each a tenant's 1,000-token prefix + a 32-token
question, shuffled. `--workload trace` replays a Mooncake or Claude Code trace (hash ids → token
ids, scaled by `--length-scale`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from radixkv.bench.cluster.cluster_driver import ClusterRun, drive
from radixkv.bench.cluster.cluster_report import (
    DEFAULT_CONFIGS,
    ONE_POOL,
    SimSetup,
    format_table,
    parse_config,
    real_summary,
    simulate_all,
)
from radixkv.bench.inputs.trace_files import display_args
from radixkv.bench.inputs.workload_cli import add_workload_args, build_workload, token_source
from radixkv.bench.inputs.workloads import Workload
from radixkv.bench.serving.client import ClientOptions
from radixkv.bench.tiny_model import TINY_NAME, resolve_model

# The multi-tenant setting (flags left unset take these).
WORKLOAD_DEFAULTS: dict[str, Any] = dict(
    num_groups=6, prompts_per_group=18, system_len=1000, question_len=32, output_len=4
)


def register(subparsers: Any) -> None:
    """Add `radixkv bench cluster`."""
    p = subparsers.add_parser(
        "cluster",
        help="N replicas behind a router (round_robin / cache_aware / kv_aware, +shared L3) "
        "vs an offline simulation and one global pool",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        default=TINY_NAME,
        help="checkpoint dir or embedded name for the replicas; 'tiny' (default): a seeded "
        "random 2-layer Llama with the default model's tokenizer",
    )
    p.add_argument("--replicas", type=int, default=3, help="default %(default)s")
    p.add_argument(
        "--num-slots",
        type=int,
        default=2560,
        help="KV pool tokens per replica (default %(default)s: about two and a half of the "
        "default workload's 1,032-token prompts)",
    )
    p.add_argument("--page-size", type=int, default=16, help="default %(default)s")
    p.add_argument(
        "--configs",
        nargs="+",
        default=list(DEFAULT_CONFIGS),
        metavar="CONFIG",
        help="round_robin, cache_aware, kv_aware, each optionally +l2 (host RAM tier per "
        "replica) and/or +l3 (one shared Redis), and one_pool (one "
        "replica of the summed pool, no router); default: %(default)s",
    )
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    p.add_argument("--sim-only", action="store_true", help="run the simulation only")
    p.add_argument(
        "--sim-in-flight",
        type=int,
        default=0,
        metavar="K",
        help="simulation: a request's pages become visible K requests after it (concurrent "
        "requests missing each other's prefixes); default 0: in order, as a replica that admits "
        "a queued request only after the earlier one's prefill mostly behaves",
    )
    p.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra `radixkv serve` argument for every replica (repeat: --serve-arg=--threads=1)",
    )
    p.add_argument(
        "--router-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra router argument (repeat; e.g. --router-arg=--balance-abs-threshold=1000000)",
    )
    p.add_argument("--router-python", default=None, help="interpreter with smg / vllm-router")
    p.add_argument("--seed", type=int, default=0, help="workload seed")
    p.add_argument("--request-timeout", type=float, default=600.0, help="per request, seconds")
    p.add_argument("--json", type=Path, default=None, help="write every figure here")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    add_workload_args(p)
    # Traces: in arrival order, paced by --concurrency alone (--time-scale 1 keeps their clock).
    p.set_defaults(func=run, prompt_format="text", time_scale=0.0)


def _workload(args: argparse.Namespace, model: str | None) -> Workload:
    if args.workload == "shared-prefix":
        for key, value in WORKLOAD_DEFAULTS.items():
            if getattr(args, key, None) is None:
                setattr(args, key, value)
    if args.tokenizer is None and model is not None and Path(model).is_dir():
        args.tokenizer = model
    if args.tokenizer is None and args.prompt_format == "text":
        from radixkv.model import default_model_path

        args.tokenizer = str(default_model_path())
    return build_workload(args, token_source(args))


def serve_args(args: argparse.Namespace, num_slots: int | None = None) -> tuple[str, ...]:
    """What every replica runs with (on top of the launcher's own flags): the pool, the page,
    one torch thread each and no compilation (N replicas share the machine's cores; the figures
    are about cache hits, and a cold compile would dominate a short run), then --serve-arg."""
    slots = num_slots if num_slots is not None else args.num_slots
    out = ["--num-slots", str(slots), "--page-size", str(args.page_size)]
    out += ["--threads", "1", "--no-compile", "--log-level", "warning"]
    return (*out, *args.serve_arg)


def run_config(
    args: argparse.Namespace, name: str, model: str | None, workload: Workload
) -> dict[str, Any]:
    """Start a fresh cluster for `name`, send the workload through its router, stop it."""
    from radixkv.cluster.launch import ClusterSpec, start_cluster

    cfg = parse_config(name)
    router, policy, l3 = cfg.router, cfg.policy, cfg.shared_l3
    l2 = ("--enable-hierarchical-cache",) if cfg.host_l2 else ()
    replicas, slots = args.replicas, args.num_slots
    if name == ONE_POOL:  # one replica of the summed pool, sent to directly
        replicas, slots = 1, args.num_slots * args.replicas
    spec = ClusterSpec(
        replicas=replicas,
        model=model,
        serve_args=(*serve_args(args, slots), *l2),
        policy=policy if router != "none" else "cache_aware",
        router=router,
        shared_l3=l3,
        kv_events=policy == "kv_aware",
        router_python=args.router_python,
        router_args=tuple(args.router_arg),
    )
    t0 = time.perf_counter()
    with start_cluster(spec) as cluster:
        started = time.perf_counter() - t0
        url = cluster.router_url or cluster.worker_urls[0]
        run = _drive(args, url, list(cluster.worker_urls), workload, name)
    return {
        "router": router,
        "policy": policy,
        "shared_l3": l3,
        "host_l2": cfg.host_l2,
        "start_s": started,
        "run": run,
    }


def _drive(
    args: argparse.Namespace, router_url: str, workers: list[str], workload: Workload, name: str
) -> ClusterRun:
    from radixkv.bench.serving.serve import served_model_name

    async def go() -> ClusterRun:
        model = await served_model_name(router_url)
        has_arrivals = any(r.arrival_s is not None for r in workload.requests)
        opts = ClientOptions(
            base_url=router_url,
            model=model,
            concurrency=args.concurrency,
            use_arrival_times=has_arrivals,
            request_timeout=args.request_timeout,
        )
        bar = None
        if args.progress:
            from tqdm import tqdm

            bar = tqdm(total=len(workload.requests), desc=name, file=sys.stderr)
        try:
            tag = f"bench-cluster-{secrets.token_hex(4)}"
            return await drive(workload.requests, opts, workers, tag=tag, progress=bar)
        finally:
            if bar is not None:
                bar.close()

    return asyncio.run(go())


def run(args: argparse.Namespace) -> int:
    """`radixkv bench cluster`: simulate, run each configuration, print the table, write JSON."""
    try:
        for name in args.configs:
            parse_config(name)
    except ValueError as exc:
        print(f"radixkv bench cluster: {exc}", file=sys.stderr)
        return 2
    model = args.model if args.sim_only and args.model == TINY_NAME else resolve_model(args.model)
    workload = _workload(args, model)
    prompts = [r.prompt_ids for r in workload.requests]
    setup = SimSetup(
        args.replicas, args.num_slots // args.page_size, args.page_size, args.sim_in_flight
    )
    sims = simulate_all(prompts, setup, args.configs)
    ideal = sims["ideal"].cached_tokens
    real: dict[str, dict[str, Any]] = {}
    meta: dict[str, dict[str, Any]] = {}
    for name in [] if args.sim_only else args.configs:
        done = run_config(args, name, model, workload)
        run_done = done.pop("run")
        real[name] = real_summary(run_done, len(run_done.replica_stats), ideal)
        meta[name] = done
        print(f"{name}: {100 * real[name]['hit_rate']:.1f}% hit", file=sys.stderr, flush=True)
    title = (
        f"{workload.name}: {len(prompts)} requests, {workload.prompt_tokens:,} prompt tokens; "
        f"{args.replicas} replicas x {args.num_slots:,} KV tokens, page {args.page_size}, "
        f"concurrency {args.concurrency}; ideal {ideal:,} cached tokens"
    )
    print(title)
    print(format_table(sims, real, args.configs))
    if args.json:
        doc = {
            "argv": display_args(sys.argv[1:]),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "workload": workload.describe(),
            "cluster": {**vars(setup), "num_slots": args.num_slots, "serve_args": serve_args(args)},
            "simulation": {k: v.to_dict() for k, v in sims.items()},
            "real": {k: {**meta[k], **v} for k, v in real.items()},
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1))
    failed = any(r["errors"] or not r["completed"] for r in real.values())
    return 1 if failed else 0

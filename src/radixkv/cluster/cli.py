"""`radixkv cluster up`: try a cluster on one machine.

A convenience, not a deployment: it starts N `radixkv serve` replicas on loopback behind a real,
existing router (the SGLang Model Gateway `smg` by default, or vllm-router; installed on first
use into a cached virtualenv), optionally with one shared Redis L3 and KV events, prints the
router's URL, and stops everything on Ctrl-C (or SIGTERM). RadixKV has no router of its own;
docs/deploy.md shows the same pieces on N hosts.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from radixkv.cluster.launch import ClusterSpec, RunningCluster, start_cluster
from radixkv.cluster.procs import ClusterError
from radixkv.cluster.routers import ROUTERS, RouterInstallError

POLICIES = ("cache_aware", "round_robin", "random", "power_of_two", "kv_aware")


def register(subparsers: Any) -> None:
    cluster = subparsers.add_parser("cluster", help="try N replicas behind a router, locally")
    sub = cluster.add_subparsers(dest="cluster_command", metavar="ACTION")
    up = sub.add_parser(
        "up",
        help="start N replicas + a router (+ Redis) on loopback until Ctrl-C",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    up.add_argument("--replicas", type=int, default=2, help="replicas to start (default: 2)")
    up.add_argument("--model", default=None, help="as `radixkv serve --model` (default model)")
    up.add_argument("--router", choices=ROUTERS, default="smg", help="default: smg")
    up.add_argument(
        "--policy", choices=POLICIES, default=None,
        help="the router's policy (default: cache_aware; kv_aware with --router vllm-router)",
    )  # fmt: skip
    up.add_argument(
        "--shared-l3", action="store_true",
        help="start a redis-server and give every replica --hicache-storage-backend redis",
    )  # fmt: skip
    up.add_argument(
        "--kv-events", action="store_true",
        help="replicas publish KV events (implied by --router vllm-router)",
    )  # fmt: skip
    up.add_argument("--api-key", default=None, help="required by the router and the replicas")
    up.add_argument("--router-python", default=None, help="a Python with the router installed")
    up.add_argument(
        "--log-dir", default=None,
        help="kept (default: a new temporary directory, removed after a clean stop and kept, "
        "with a warning naming it, when something failed)",
    )  # fmt: skip
    up.add_argument(
        "serve_args", nargs=argparse.REMAINDER,
        help="after `--`: flags for every `radixkv serve` (e.g. -- --num-slots 8192)",
    )  # fmt: skip
    up.set_defaults(func=run_up)
    cluster.set_defaults(func=lambda args: cluster.print_help() or 2)


def spec_from_args(args: argparse.Namespace) -> ClusterSpec:
    serve_args = list(args.serve_args)
    if serve_args[:1] == ["--"]:
        serve_args = serve_args[1:]
    vllm = args.router == "vllm-router"
    policy = args.policy or ("kv_aware" if vllm else "cache_aware")
    return ClusterSpec(
        replicas=args.replicas,
        model=args.model,
        serve_args=tuple(serve_args),
        policy=policy,
        router=args.router,
        shared_l3=args.shared_l3,
        kv_events=args.kv_events or (vllm and policy == "kv_aware"),
        router_python=args.router_python,
        api_key=args.api_key,
        log_dir=args.log_dir,
    )


def describe(cluster: RunningCluster) -> str:
    lines = []
    for i, url in enumerate(cluster.worker_urls):
        line = f"  replica {i}: {url}"
        if cluster.kv_event_endpoints:
            line += f"  (KV events {cluster.kv_event_endpoints[i]}"
            line += f", replay {cluster.kv_replay_endpoints[i]})"
        lines.append(line)
    if cluster.redis_url:
        lines.append(f"  shared L3: {cluster.redis_url}")
    kept = "" if cluster.spec.log_dir else " (removed after a clean stop)"
    lines.append(f"  logs: {cluster.log_dir}{kept}")
    if cluster.router_url:
        spec = cluster.spec
        lines.insert(0, f"{spec.router} ({spec.policy}) at {cluster.router_url}/v1")
    return "\n".join(lines)


def run_up(args: argparse.Namespace) -> int:
    try:
        spec = spec_from_args(args)
        print(f"starting {spec.replicas} replicas behind {spec.router} ...", flush=True)
        with start_cluster(spec) as cluster:
            print(describe(cluster), flush=True)
            print(f"Serving '{cluster.model_name}'. Ctrl-C stops everything.", flush=True)
            while all(w.alive for w in cluster.workers) and (
                cluster.router is None or cluster.router.alive
            ):
                time.sleep(0.5)
            dead = [w.name for w in cluster.workers if not w.alive]
            if cluster.router is not None and not cluster.router.alive:
                dead.append(cluster.router.name)
            print(f"{', '.join(dead)} exited; stopping the cluster", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 0
    except (ClusterError, RouterInstallError, ValueError) as exc:
        print(f"radixkv cluster up: {exc}", file=sys.stderr)
        return 1

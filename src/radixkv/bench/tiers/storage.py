"""`radixkv bench storage`: the L3 stores side by side (file, Redis, Redis Cluster, Mooncake).

Per store, two measurements:
- fetch cost per page: `--pages` checksummed pages of `--page-bytes` written through the storage
  worker, then read back as the engine does (batches of 32 keys per round trip, every page
  verified), `--repeats` times; the median wall time per page and the bandwidth it implies;
- a new replica: engine A (the model of the engine flags) computes a `--prefix-len`-token
  prompt and shuts down; engine B, started fresh on the same store, answers the prefix plus a
  new question. Reported: how many of B's prompt tokens came from the store, and its TTFT next
  to a cold engine's.

Stores without a URL are started on loopback in a temporary directory (redis-server, a 3-node
cluster, mooncake_master + a store service) and stopped afterwards; a store that cannot be
started is listed with the reason. Everything binds 127.0.0.1: figures are loopback figures.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STORES = ("file", "redis", "redis-cluster", "mooncake")
# SmolLM2-135M (the default model): 2 x 30 layers x 3 KV heads x 64 dims x 2 bytes x 16 tokens.
DEFAULT_PAGE_BYTES = 368_640


def register(subparsers: Any) -> None:
    from radixkv.engine.args import add_engine_args

    p = subparsers.add_parser("storage", help="L3 stores compared: fetch cost, a new replica")
    add_engine_args(p)
    s = p.add_argument_group("stores")
    s.add_argument("--stores", default=",".join(STORES), help="comma list of " + "|".join(STORES))
    s.add_argument("--redis-url", default=None, help="redis://... (default: start one)")
    s.add_argument("--cluster-url", default=None, help="redis-cluster://... (default: start 3)")
    s.add_argument("--mooncake", default=None, help="master host:port or JSON (default: start)")
    s.add_argument("--pages", type=int, default=256, help="pages written and fetched")
    s.add_argument("--page-bytes", type=int, default=DEFAULT_PAGE_BYTES, help="payload per page")
    s.add_argument("--repeats", type=int, default=5, help="fetches of all pages (median)")
    s.add_argument("--prefix-len", type=int, default=512, help="replica check: prompt prefix")
    s.add_argument("--skip-replica", action="store_true", help="only the fetch cost")
    p.add_argument("--json", default=None, help="also write the results as JSON here")
    p.set_defaults(func=main)


@contextlib.contextmanager
def open_store(name: str, args: argparse.Namespace, tmp: Path) -> Iterator[tuple[str, str]]:
    """(backend kind, URL) of a store, started on loopback for the duration when no URL given."""
    from radixkv.storage.local_services import MooncakeProcs, RedisClusterProcs

    if name == "file":
        yield "file", str(tmp / "file-l3")
    elif name == "redis" and args.redis_url:
        yield "redis", args.redis_url
    elif name == "redis":
        procs: Any = RedisClusterProcs(tmp / "redis", nodes=1, cluster=False)
        with _running(procs, start=procs.start):
            yield "redis", procs.url
    elif name == "redis-cluster" and args.cluster_url:
        yield "redis", args.cluster_url
    elif name == "redis-cluster":
        procs = RedisClusterProcs(tmp / "cluster", nodes=3)
        with _running(procs, start=procs.start):
            yield "redis", procs.url
    elif name == "mooncake" and args.mooncake:
        yield "mooncake", args.mooncake
    elif name == "mooncake":
        procs = MooncakeProcs(tmp / "mooncake", segment_bytes=1 << 30)
        with _running(procs, start=procs.start):
            conf = tmp / "mooncake.json"
            conf.write_text(json.dumps(procs.client_config()))
            yield "mooncake", str(conf)
    else:
        raise SystemExit(f"unknown store {name!r}; choose from {', '.join(STORES)}")


@contextlib.contextmanager
def _running(procs: Any, start: Any) -> Iterator[None]:
    try:
        start()
        yield
    finally:
        procs.stop()


def fetch_cost(kind: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Write `--pages` pages through a StorageWorker, then time whole fetches of them."""
    from radixkv.storage import PageMeta, make_backend
    from radixkv.storage.worker import FetchDone, StorageWorker

    meta = PageMeta("bench", "bfloat16", 1, 16, (args.page_bytes,), args.page_bytes)
    worker = StorageWorker(make_backend(kind, url, timeout_s=5.0), meta)
    rng = random.Random(0)
    keys = [f"bench-{rng.getrandbits(128):032x}" for _ in range(args.pages)]
    try:
        t0 = time.perf_counter()
        for i, key in enumerate(keys):
            payload = bytes([i % 251]) * args.page_bytes
            while not worker.submit_write(i, key, functools.partial(bytes, payload)):
                time.sleep(0.001)  # queue full: let the writer drain
        assert worker.drain_writes(120.0), "writes did not finish"
        write_s = time.perf_counter() - t0
        if worker.counters.writes_failed:
            raise RuntimeError(f"{worker.counters.writes_failed} writes failed")
        worker.poll()
        runs, round_trips = [], 0
        for r in range(args.repeats):
            t0 = time.perf_counter()
            assert worker.submit_fetch(("fetch", r), keys)
            done = [d for d in worker.poll(60.0) if isinstance(d, FetchDone)]
            while not done:
                done = [d for d in worker.poll(60.0) if isinstance(d, FetchDone)]
            runs.append(time.perf_counter() - t0)
            if len(done[0].payloads) != len(keys):
                raise RuntimeError(f"fetched {len(done[0].payloads)} of {len(keys)} pages")
            round_trips = len(done[0].timings)
        for key in keys:
            worker.backend.delete(key)
    finally:
        worker.close()
    per_page = statistics.median(runs) / len(keys)
    return {
        "fetch_us_per_page": 1e6 * per_page,
        "fetch_mb_per_s": args.page_bytes / per_page / 1e6,
        "write_us_per_page": 1e6 * write_s / len(keys),
        "round_trips_per_fetch": round_trips,
        "fetch_runs_s": runs,
    }


def replica_check(lm: Any, base: Any, kind: str, url: str, args: argparse.Namespace) -> dict:
    """Engine A computes a prefix and exits; a new engine B on the same store reuses it."""
    from radixkv.engine.engine import Engine
    from radixkv.engine.types import SamplingParams

    rng = random.Random(11)
    hi = min(30000, int(lm.config.vocab_size))
    prefix = [rng.randrange(1000, hi) for _ in range(args.prefix_len)]
    sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    cfg = base.override(
        enable_hierarchical_cache=True,
        hicache_storage_backend=kind,
        hicache_storage_url=url,
        hicache_storage_prefetch_policy="wait_complete",
    )
    a = Engine(lm, config=cfg)
    a.generate([prefix + [rng.randrange(1000, hi) for _ in range(16)]], sp)
    a.close()
    out: dict[str, Any] = {"prefix_len": args.prefix_len}
    for name, c in (("cold", base), ("new_replica", cfg)):
        engine = Engine(lm, config=c)
        q = prefix + [rng.randrange(1000, hi) for _ in range(16)]
        t0 = time.perf_counter()
        got = engine.generate([q], sp)[0]
        out[name] = {"ttft_s": time.perf_counter() - t0, "cached_tokens": got.cached_tokens}
        out[name]["prompt_tokens"] = len(q)
        if name == "new_replica":
            out[name]["storage_tokens"] = engine.metrics().cached_tokens_by_tier["storage"]
        engine.close()
    return out


def format_table(results: dict[str, Any]) -> str:
    lines = [
        f"{'store':<14} {'fetch us/page':>13} {'MB/s':>7} {'write us/page':>13} "
        f"{'new replica: from store':>24} {'TTFT cold -> replica':>22}"
    ]
    for name, r in results["stores"].items():
        if "error" in r:
            lines.append(f"{name:<14} not run: {r['error']}")
            continue
        f, rep = r["fetch"], r.get("replica")
        found = ttft = ""
        if rep:
            nr = rep["new_replica"]
            found = f"{nr['storage_tokens']}/{nr['prompt_tokens']} tok"
            ttft = f"{1000 * rep['cold']['ttft_s']:.0f} -> {1000 * nr['ttft_s']:.0f} ms"
        lines.append(
            f"{name:<14} {f['fetch_us_per_page']:>13.0f} {f['fetch_mb_per_s']:>7.0f} "
            f"{f['write_us_per_page']:>13.0f} {found:>24} {ttft:>22}"
        )
    lines.append(f"({results['pages']} pages of {results['page_bytes']} bytes, loopback)")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    lm = base = None
    if not args.skip_replica:
        from radixkv.bench.engine_driver import load_for_bench

        base, lm, _, _ = load_for_bench(args)
    results: dict[str, Any] = {"pages": args.pages, "page_bytes": args.page_bytes, "stores": {}}
    for name in stores:
        print(f"store {name}...", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="radixkv-bench-l3-") as tmp:
            try:
                with open_store(name, args, Path(tmp)) as (kind, url):
                    res: dict[str, Any] = {"fetch": fetch_cost(kind, url, args)}
                    if lm is not None:
                        res["replica"] = replica_check(lm, base, kind, url, args)
            except (RuntimeError, OSError, AssertionError) as exc:
                res = {"error": f"{type(exc).__name__}: {exc}"}
        results["stores"][name] = res
    print(format_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0

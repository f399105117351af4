"""`radixkv bench tierload`: the L3 -> L2 -> L1 load path alone, tokens per second.

`--pages` pages of the default model's KV shape (SmolLM2-135M: 30 layers, 3 KV heads, 64 dims,
bf16, 16 tokens a page) are written through a real TierManager to a file store in a temporary
directory; then, `--repeats` times, L2 is emptied and one request's worth of pages is fetched
exactly as the engine does (`StorageTier.start_prefetch`, the storage thread reads and verifies
them, `poll` lands them in L2) and copied into device (L1) pages (`HostKVPool.load`). Reported,
median over the repeats: the fetch (read + verify on the storage thread, waited for), the landing
(engine thread: payloads into L2) and the L2 -> L1 copy, each in ms and the whole in tokens/s.

The loaded pages are compared with what was stored (every byte), so a fast but wrong path fails
the bench instead of winning it. Only public engine APIs are used, so the same file can time
another checkout's code (put that checkout's `src` first on the path).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from typing import Any

PHASES = ("fetch", "land", "l1_copy")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("tierload", help="L3 -> L2 -> L1 page loads alone (tokens/s)")
    p.add_argument("--pages", type=int, default=256, help="pages stored and loaded per repeat")
    p.add_argument("--repeats", type=int, default=7, help="loads of all pages (median)")
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--json", default=None, help="also write the results as JSON here")
    p.set_defaults(func=main)


def _setup(args: argparse.Namespace, store: str) -> Any:
    import torch

    from radixkv.engine.tiers.manager import TierManager
    from radixkv.engine.tiers.prefetch import PrefetchPolicy
    from radixkv.memory.pool import KVPool, KVPoolConfig

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    slots = (args.pages + 1) * args.page_size
    cfg = KVPoolConfig(args.layers, args.kv_heads, args.head_dim, slots, dtype)
    pool = KVPool(cfg)
    policy = PrefetchPolicy("wait_complete")
    tm = TierManager(
        pool, args.page_size, args.pages, "write_back", "bench", ("file", store), 5.0, policy
    )
    return torch, pool, tm


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Store the pages once, then time `--repeats` loads of all of them (see the module doc)."""
    with tempfile.TemporaryDirectory(prefix="radixkv-bench-tierload-") as store:
        torch, pool, tm = _setup(args, store)
        st = tm.storage
        assert st is not None
        n, ps = args.pages, args.page_size
        gen = torch.Generator().manual_seed(0)
        tm.host.data.copy_(torch.randn(tm.host.data.shape, generator=gen).to(tm.host.data.dtype))
        hashes = [i.to_bytes(4, "little") * 8 for i in range(n)]
        stored = tm.index.alloc(n)
        assert stored is not None
        want = tm.host.data[stored].clone()  # page i: what is stored under hashes[i]
        for hp, h in zip(stored, hashes, strict=True):
            st.index.add(h, hp)
            st.write(hp, h)
        assert st.worker.drain_writes(300.0), "writes did not finish"
        st.poll()
        runs: list[dict[str, float]] = []
        for r in range(args.repeats):
            tm.index.clear()
            t: dict[str, float] = {}
            t0 = time.perf_counter()
            rid = f"r{r}"
            st.start_prefetch(rid, hashes, [], ps)
            done = st.worker.results.get(timeout=300.0)  # the FetchDone (nothing else queued)
            t["fetch"] = time.perf_counter() - t0
            t1 = time.perf_counter()
            st.worker.results.put(done)
            st.poll()
            t["land"] = time.perf_counter() - t1
            found = [tm.index.lookup(h) for h in hashes]
            host_pages = [hp for hp in found if hp is not None]
            if len(host_pages) < n:
                raise RuntimeError(f"only {len(host_pages)} of {n} pages landed")
            t2 = time.perf_counter()
            tm.host.load(host_pages, list(range(n)))
            t["l1_copy"] = time.perf_counter() - t2
            st.end_hold(rid)
            st.forget(rid)
            runs.append(t)
            _check(torch, pool, want, n, ps)
        tm.close(set())
    med = {k: statistics.median(t[k] for t in runs) for k in PHASES}
    total = sum(med.values())
    return {
        "pages": n,
        "page_bytes": int(want[0].numel() * want.element_size()),
        "tokens": n * ps,
        "ms": {k: 1e3 * v for k, v in med.items()},
        "tokens_per_s": n * ps / total,
        "runs": runs,
    }


def _check(torch: Any, pool: Any, want: Any, n: int, ps: int) -> None:
    """Device page i (loaded from the host page of hashes[i]) equals what was stored as i."""
    for layer in range(len(pool.k)):
        k = pool.k[layer][: n * ps].view(n, ps, *pool.k[layer].shape[1:])
        v = pool.v[layer][: n * ps].view(n, ps, *pool.v[layer].shape[1:])
        if not (torch.equal(k, want[:n, layer, 0]) and torch.equal(v, want[:n, layer, 1])):
            raise RuntimeError(f"layer {layer}: loaded KV differs from the stored pages")


def format_table(res: dict[str, Any]) -> str:
    ms = res["ms"]
    return "\n".join(
        [
            f"{'pages':>6} {'MB':>7} {'fetch ms':>9} {'land ms':>8} {'L1 copy ms':>10} "
            f"{'tokens/s':>10}",
            f"{res['pages']:>6} {res['pages'] * res['page_bytes'] / 1e6:>7.1f} "
            f"{ms['fetch']:>9.1f} {ms['land']:>8.1f} {ms['l1_copy']:>10.1f} "
            f"{res['tokens_per_s']:>10.0f}",
        ]
    )


def main(args: argparse.Namespace) -> int:
    res = run(args)
    print(format_table(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    print(json.dumps({k: res[k] for k in ("tokens_per_s", "ms")}), file=sys.stderr)
    return 0

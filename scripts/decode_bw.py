"""The decode-attention kernel's read rate: `python -m scripts.decode_bw`.

Times one `decode_attention` call (best of `--repeats`) over a pool of random K/V rows whose
contexts sit in pages of 16 slots in random page order (what a page-16 pool gives after churn),
for the head layouts of the default model (9/3/64), Gemma 3 270M (4/1/256) and the 1B shape
(32/8/64), and prints the K/V bytes read per second beside a streaming read of DRAM on the same
threads. `--so PATH` loads another build of the kernels (an A/B of two builds runs as two
processes: two builds in one process share their template symbols). One thread is timed with
the thread's CPU time (a shared machine's load does not inflate it), more with the wall clock.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from collections.abc import Callable
from typing import Any

import torch

LAYOUTS = {"default": (9, 3, 64), "gemma3": (4, 1, 256), "1b": (32, 8, 64)}


def _kernels(so: str | None) -> Any:
    if so is None:
        from radixkv.model.kernels import cpu_kernels

        return cpu_kernels()
    spec = importlib.util.spec_from_file_location("radixkv_cpu_kernels", so)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _best(fn: Callable[[], Any], repeats: int, clock: Callable[[], float]) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return min(times)


def measure(m: Any, dtype: torch.dtype, layout: str, reqs: int, ctx: int, repeats: int) -> dict:
    """One case: the call's time, the K/V bytes it reads and their rate."""
    heads, kv, dim = LAYOUTS[layout]
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    n = ctx * reqs + 64
    g = torch.Generator().manual_seed(0)
    pool = torch.randn(2, n, kv, dim, generator=g).to(dtype)
    pages = torch.randperm(n // 16, generator=g)
    slots = (pages[:, None] * 16 + torch.arange(16)).reshape(-1)[: ctx * reqs]
    slots = slots.view(reqs, ctx).contiguous()
    q = torch.randn(reqs, heads, dim, generator=g).to(dtype)
    lens = torch.full((reqs,), ctx, dtype=torch.int64)
    t = _best(
        lambda: m.decode_attention(q, pool[0], pool[1], slots, lens, 0, dim**-0.5), repeats, clock
    )
    nbytes = reqs * ctx * kv * dim * 2 * pool.element_size()
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "layout": layout,
        "requests": reqs,
        "context": ctx,
        "ms": 1000 * t,
        "gb_per_s": nbytes / t / 1e9,
    }


def stream_gb_per_s(repeats: int) -> float:
    """A streaming read (a sum) of 256 MB, far past any L3."""
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    buf = torch.ones(64 << 20)
    return buf.numel() * 4 / _best(buf.sum, repeats, clock) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument(
        "--cases",
        default="default:4:8192,gemma3:1:32768,1b:1:32768,1b:4:8192",
        help="layout:requests:context, comma-separated",
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--so", default=None, help="a kernels .so to load instead of this build's")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    m = _kernels(args.so)
    rows = []
    for name in args.dtypes.split(","):
        for case in args.cases.split(","):
            layout, reqs, ctx = case.split(":")
            row = measure(m, getattr(torch, name), layout, int(reqs), int(ctx), args.repeats)
            rows.append(row)
            print(
                f"{row['dtype']:9s} {layout:8s} {reqs:>2s} x {int(ctx):6,d}: "
                f"{row['ms']:7.2f} ms {row['gb_per_s']:6.1f} GB/s",
                flush=True,
            )
    stream = stream_gb_per_s(args.repeats)
    print(f"streaming read, {args.threads} thread(s): {stream:.1f} GB/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"threads": args.threads, "stream_gb_per_s": stream, "rows": rows}, f, indent=1
            )


if __name__ == "__main__":
    main()

"""The row-invariant GEMM against oneDNN: `python -m radixkv.bench.gemm_bench`.

For each projection shape of a model (default: the embedded default model, SmolLM2-135M: fused
QKV 576 -> 960, O 576 -> 576, fused gate/up 576 -> 3072, down 1536 -> 576, and the lm head
576 -> 49152 at decode row counts only, as the engine applies it to each request's last token),
each row count M and each dtype: the time of our kernel (`radixkv.model.kernels.gemm`, the
weight packed once) and of `torch.nn.functional.linear` (oneDNN) on the same x and W. The two run
alternately, call by call, so a shared machine's load hits them alike; each figure is the best of
the repeats (the least disturbed). Prints a table and, with --json, writes the figures.

`--clock cpu --threads 1` times the calling thread's CPU time instead of wall time: on a host
shared with other jobs a one-thread kernel's CPU time leaves out the time it waited for a core,
which wall time (and any multi-thread barrier) does not.

`ratio` is our time over oneDNN's (< 1: ours is faster).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

# (name, in features K, out features N, largest M it is measured at)
DEFAULT_SHAPES = [
    ("qkv", 576, 960, 1 << 30),
    ("o", 576, 576, 1 << 30),
    ("gate_up", 576, 3072, 1 << 30),
    ("down", 1536, 576, 1 << 30),
    ("lm_head", 576, 49152, 64),
]
# The Llama-3.2-1B shape (hidden 2,048, 32/8 heads of 64, MLP 8,192; the default tokenizer's
# 49,152-token vocabulary), the standing speed benchmark's model.
SHAPES_1B = [
    ("qkv", 2048, 3072, 1 << 30),
    ("o", 2048, 2048, 1 << 30),
    ("gate_up", 2048, 16384, 1 << 30),
    ("down", 8192, 2048, 1 << 30),
    ("lm_head", 2048, 49152, 64),
]
SHAPE_SETS = {"default": DEFAULT_SHAPES, "1b": SHAPES_1B}
DEFAULT_ROWS = [1, 4, 16, 64, 256, 1024, 2048]


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
_clock = time.perf_counter


def _timed(fn: Callable[[], object]) -> float:
    t0 = _clock()
    fn()
    return _clock() - t0


def compare(k: int, n: int, m: int, dtype: torch.dtype, repeats: int) -> dict[str, float]:
    """Best-of-`repeats` seconds of ours and of oneDNN for x [m, k] W^T, W [n, k], alternated;
    also checks the two agree within float tolerance (a wrong kernel must not look fast)."""
    from radixkv.model.kernels import gemm

    mod = gemm(dtype)
    if mod is None:
        raise SystemExit(f"no row-invariant GEMM for {dtype} on this CPU")
    gen = torch.Generator().manual_seed(m * 7 + n)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
    x = torch.randn(m, k, generator=gen).to(dtype)
    packed = mod.gemm_pack(w)

    def ours() -> torch.Tensor:
        out: torch.Tensor = mod.gemm(x, packed, n, None)
        return out

    def onednn() -> torch.Tensor:
        return F.linear(x, w)

    ref = torch.nn.functional.linear(x.double(), w.double())
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    err = float((ours().double() - ref).abs().max())
    if err > tol * max(1.0, float(ref.abs().max())):
        raise AssertionError(f"gemm k={k} n={n} m={m} {dtype}: max error {err}")
    for _ in range(2):
        ours(), onednn()
    t_ours, t_dnn = [], []
    for _ in range(repeats):
        t_ours.append(_timed(ours))
        t_dnn.append(_timed(onednn))
    flops = 2.0 * m * k * n
    best_ours, best_dnn = min(t_ours), min(t_dnn)
    return {
        "ours_ms": 1000 * best_ours,
        "onednn_ms": 1000 * best_dnn,
        "ours_gflops": flops / best_ours / 1e9,
        "onednn_gflops": flops / best_dnn / 1e9,
        "ratio": best_ours / best_dnn,
    }


def _repeats(k: int, n: int, m: int, budget_flops: float) -> int:
    """Enough calls to spend about `budget_flops` per variant (3..50)."""
    return int(min(50, max(3, budget_flops / (2.0 * m * k * n))))


def run(
    shapes: list[tuple[str, int, int, int]],
    rows: list[int],
    dtypes: list[torch.dtype],
    budget_gflop: float,
) -> list[dict[str, Any]]:
    results = []
    for dtype in dtypes:
        for name, k, n, max_m in shapes:
            for m in rows:
                if m > max_m:
                    continue
                reps = _repeats(k, n, m, budget_gflop * 1e9)
                fig = compare(k, n, m, dtype, reps)
                row = {"dtype": str(dtype).removeprefix("torch."), "shape": name, "k": k}
                row |= {"n": n, "m": m, "repeats": reps, **fig}
                results.append(row)
                print(
                    f"{row['dtype']:>8} {name:>8} K={k:<5} N={n:<6} M={m:<5} "
                    f"ours {fig['ours_gflops']:7.1f}  oneDNN {fig['onednn_gflops']:7.1f} GFLOP/s"
                    f"  ratio {fig['ratio']:.2f}",
                    flush=True,
                )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", default=",".join(map(str, DEFAULT_ROWS)), help="M values")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--shapes", default=",".join(s[0] for s in DEFAULT_SHAPES))
    parser.add_argument(
        "--model", choices=sorted(SHAPE_SETS), default="default", help="whose projection shapes"
    )
    parser.add_argument("--budget-gflop", type=float, default=20.0, help="work per variant")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock == "cpu" and torch.get_num_threads() != 1:
        raise SystemExit("--clock cpu measures one thread: add --threads 1")
    global _clock
    _clock = CLOCKS[args.clock]
    wanted = set(args.shapes.split(","))
    shapes = [s for s in SHAPE_SETS[args.model] if s[0] in wanted]
    rows = [int(r) for r in args.rows.split(",")]
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    with torch.inference_mode():
        results = run(shapes, rows, dtypes, args.budget_gflop)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            from radixkv.model.kernels import kernel_paths

            meta = {"threads": torch.get_num_threads(), "clock": args.clock, "model": args.model}
            meta["kernel_paths"] = kernel_paths()
            json.dump({**meta, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()

"""Gemma 3 270M on CPU with the C++ (1 + w) RMSNorm and GELU(tanh) * up ("new") against the torch
formulas they replaced ("old"), interleaved in one process so a shared machine's load hits both:
`python scripts/gemma_ops.py [bfloat16|float32] [--reps 6]`. Each rep generates 4 prompts x 300
tokens + 48 decoded (greedy, ignore_eos) per mode, new and old alternating first; prints wall and
process CPU time per generate and the medians' ratio (new / old)."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import radixkv.model.nn.layers as layers
from radixkv.engine.engine import Engine
from radixkv.engine.types import SamplingParams


class _TorchFormulas:
    """The C++ module with the two new ops answered by the torch formulas of before."""

    def __init__(self, kernels: Any) -> None:
        self.kernels = kernels

    def rms_norm_1p(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return layers.rms_norm_1p_torch(x, w, eps)

    def gelu_tanh_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return layers.gelu_mul_torch(gate_up, tanh=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kernels, name)


def _old(real: Callable[[torch.Tensor], Any]) -> Callable[[torch.Tensor], Any]:
    def pick(x: torch.Tensor) -> Any:
        k = real(x)
        return None if k is None else _TorchFormulas(k)

    return pick


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dtype", nargs="?", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--reps", type=int, default=6)
    args = p.parse_args()
    eng = Engine("gemma3-270m", device="cpu", dtype=args.dtype)
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    real = layers._cpp
    wall: dict[str, list[float]] = {"new": [], "old": []}
    cpu: dict[str, list[float]] = {"new": [], "old": []}
    eng.generate([[5] * 100], params)
    for rep in range(args.reps):
        for mode in ("new", "old") if rep % 2 == 0 else ("old", "new"):
            base = 1000 + 13 * rep + (500 if mode == "old" else 0)  # never a cache hit
            prompts = [[base + i] * 300 for i in range(4)]
            if mode == "old":
                layers._cpp = _old(real)  # type: ignore[assignment]
            t0, c0 = time.perf_counter(), time.process_time()
            eng.generate(prompts, params)
            wall[mode].append(time.perf_counter() - t0)
            cpu[mode].append(time.process_time() - c0)
            layers._cpp = real
    for mode in wall:
        med, cpu_med = statistics.median(wall[mode]), statistics.median(cpu[mode])
        runs = [round(t, 2) for t in wall[mode]]
        print(f"{mode}: wall {runs} s, median {med:.3f} s, CPU median {cpu_med:.3f} s")
    ratio = statistics.median(wall["new"]) / statistics.median(wall["old"])
    cpu_ratio = statistics.median(cpu["new"]) / statistics.median(cpu["old"])
    print(f"{args.dtype}: new / old wall {ratio:.3f}, CPU {cpu_ratio:.3f}")


if __name__ == "__main__":
    main()

"""The GPU check's exactness stage, run on CPU with a tiny checkpoint (so the script that only a
GPU machine runs in full is exercised here)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from scripts.gpu_check import exactness, main


def test_exactness_stage_on_cpu(tiny_model_dir: Callable[..., Path]) -> None:
    path = str(tiny_model_dir("llama"))
    f32 = exactness(path, "cpu", torch.float32)
    assert f32["ok"] and f32["argmax_agreement"] == 1.0, f32
    bf16 = exactness(path, "cpu", torch.bfloat16)
    assert bf16["max_rel_err"] < 0.1, bf16


def test_cuda_without_a_gpu_is_refused() -> None:
    if not torch.cuda.is_available():
        assert main(["--device", "cuda", "--skip-bench"]) == 2

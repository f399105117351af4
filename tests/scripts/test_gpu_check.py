"""The GPU check's exactness stage, run on CPU with a tiny checkpoint (so the script that only a
GPU machine runs in full is exercised here)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
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


def test_triton_stage_is_skipped_cleanly_on_cpu() -> None:
    from scripts.gpu_triton import triton_check

    result = triton_check("cpu")
    assert result["ok"] and "CUDA" in result["skipped"], result


def test_triton_timings_run_under_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The timing code the GPU runs, on tiny shapes on the CPU (one call instead of do_bench), so
    a bug in it shows here rather than in a device session."""
    pytest.importorskip("triton")
    import scripts.gpu_triton as gt
    from radixkv.model.triton.interpreter import interpreting

    if not interpreting():
        pytest.skip("Triton is not interpreted in this process")
    monkeypatch.setattr(gt, "SHAPES", (("tiny", 4, 2, 64),))
    monkeypatch.setattr(gt, "DECODE", ((2, 40),))
    monkeypatch.setattr(gt, "EXTEND", ((20, 0), (12, 30)))
    calls = []

    def once(fn: Callable[[], object]) -> float:
        calls.append(fn())
        return 1.0

    rows = gt.bench_decode("cpu", once, 1000.0) + gt.bench_extend("cpu", once)
    assert [r["kind"] for r in rows] == ["decode", "extend", "extend"]
    assert rows[0]["GB/s"] == 2 * 40 * 2 * 64 * 2 * 2 / 1e6  # K and V bytes per ms -> GB/s
    assert rows[2]["TFLOP/s"] == 4 * 4 * 64 * (12 * 30 + 12 * 13 / 2) / 1e9
    assert len(calls) == 5 and all(isinstance(c, torch.Tensor) for c in calls)

"""The Triton element-wise kernels (radixkv.model.triton.pointwise: RMSNorm, (1 + w) RMSNorm,
SiLU * up, RoPE) under Triton's interpreter on CPU (compiled on CUDA where a GPU is visible),
with the checks scripts/gpu_triton.py runs on a device: each within its dtype's tolerance of the
torch formula, float32 RoPE equal to it bit for bit, and every row of a batch equal to that row
alone. The model's ops take these kernels on CUDA only, so the dispatch is checked too."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from radixkv.model.triton.interpreter import interpreting

DEVICE = "cpu" if interpreting() else ("cuda" if torch.cuda.is_available() else None)
pytestmark = pytest.mark.skipif(
    DEVICE is None, reason="Triton imported without TRITON_INTERPRET=1 and no CUDA device"
)


def test_every_op_matches_torch_and_is_row_invariant() -> None:
    from radixkv.model.triton.pointwise_checks import pointwise_results

    rows = pointwise_results(DEVICE)
    assert len(rows) == 16
    for row in rows:
        assert row["within_tolerance"], row
        assert row["rows_invariant"], row
        assert row.get("equal_torch", True), row


def test_a_wrong_row_would_be_caught() -> None:
    """The invariance check compares real bits: a kernel that rounded a lone row differently
    (here: the norm with another eps for one-row calls) fails it."""
    from radixkv.model.triton import pointwise
    from radixkv.model.triton.pointwise_checks import problems

    p = next(p for p in problems(torch.float32, DEVICE) if p.name == "rms_norm-576")
    x, w, eps = p.args
    full = pointwise.rms_norm(x, w, eps)
    assert torch.equal(full[2:3], p.row(2))
    assert not torch.equal(full[2:3], pointwise.rms_norm(x[2:3], w, eps * 10))


def test_the_model_ops_take_the_kernels_on_cuda_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from radixkv.model.nn import layers

    x = torch.randn(3, 64)
    assert layers._gpu(x) is None  # CPU tensors: the C++ kernels or torch
    layers._triton_module.cache_clear()
    monkeypatch.setenv("RADIXKV_TRITON_POINTWISE", "0")
    try:
        assert layers._triton_module() is None
    finally:
        layers._triton_module.cache_clear()

"""The C++ small-GEMM kernel (decode-step projections) against F.linear, and PackedLinear's
choice of path by row count."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from radixkv.model import linear
from radixkv.model.linear import SMALL_M, PackedLinear


def _kernels(dtype: torch.dtype) -> Any:
    from radixkv.model.kernels import cpu_kernels, small_gemm

    assert cpu_kernels() is not None, "the C++ CPU kernels failed to build (see the warning)"
    module = small_gemm(dtype)
    if module is None:
        pytest.skip(f"this CPU has no small-GEMM kernel for {dtype}")
    return module


def _tol(dtype: torch.dtype) -> dict[str, float]:
    # bf16: products are exact in f32, sums are f32 in both, the output is rounded once.
    return {"rtol": 1e-5, "atol": 2e-5} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16, 17, 40])
@pytest.mark.parametrize(("n", "k"), [(16, 64), (96, 576), (48, 10)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_small_gemm_matches_linear(
    dtype: torch.dtype, m: int, n: int, k: int, with_bias: bool
) -> None:
    """Every row tiling (a tile holds up to 8 rows; 9 and 17 leave a remainder) and odd K."""
    mod = _kernels(dtype)
    if dtype == torch.bfloat16 and k % 2:
        pytest.skip("bf16 packs pairs along K")
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = torch.randn(n, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g) if with_bias else None
    got = mod.small_gemm(x, mod.small_gemm_pack(w), n, bias)
    assert got.dtype == dtype and got.shape == (m, n)
    want = F.linear(x.float(), w.float(), bias)
    torch.testing.assert_close(got.float(), want, **_tol(dtype))


def test_small_gemm_rejects_bad_input() -> None:
    mod = _kernels(torch.float32)
    w = torch.randn(32, 8)
    packed = mod.small_gemm_pack(w)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        mod.small_gemm_pack(torch.randn(20, 8))
    with pytest.raises(RuntimeError, match="does not fit"):
        mod.small_gemm(torch.randn(2, 9), packed, 32, None)
    with pytest.raises(RuntimeError, match="dtype"):
        mod.small_gemm(torch.randn(2, 8, dtype=torch.float64), packed, 32, None)
    with pytest.raises(RuntimeError, match="contiguous"):
        mod.small_gemm(torch.randn(8, 2).t(), packed, 32, None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_takes_the_kernel_only_for_small_batches(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Up to SMALL_M rows go through the kernel, more through oneDNN; both agree with F.linear,
    with leading dims kept."""
    mod = _kernels(dtype)
    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 32, generator=g).to(dtype)
    b = torch.randn(64, generator=g).to(dtype)
    lin = PackedLinear(w, b)
    assert lin.small is mod
    calls: list[int] = []
    real = lin.small

    class Spy:
        def small_gemm(self, x: torch.Tensor, *args: Any) -> torch.Tensor:
            calls.append(x.shape[0])
            return real.small_gemm(x, *args)

    monkeypatch.setattr(lin, "small", Spy())
    for shape in [(1, 32), (2, 4, 32), (SMALL_M, 32), (SMALL_M + 1, 32), (3, 40, 32)]:
        x = torch.randn(*shape, generator=g).to(dtype)
        got = lin(x)
        assert got.shape == (*shape[:-1], 64)
        torch.testing.assert_close(got.float(), F.linear(x, w, b).float(), **_tol(dtype))
    assert calls == [1, 8, SMALL_M]


def test_packed_linear_without_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """RADIXKV_SMALL_GEMM=0, an out dimension that is not a multiple of 16, or a non-CPU-packable
    weight keep the oneDNN path and no second copy of the weight."""
    monkeypatch.setenv("RADIXKV_SMALL_GEMM", "0")
    lin = PackedLinear(torch.randn(64, 32))
    assert lin.small is None and lin.small_w is None
    monkeypatch.delenv("RADIXKV_SMALL_GEMM")
    w40 = torch.randn(40, 32)
    odd = PackedLinear(w40)
    assert odd.small is None
    x = torch.randn(2, 32)
    torch.testing.assert_close(odd(x), F.linear(x, w40))
    assert linear._small_kernels(torch.randn(64, 32, dtype=torch.float64)) is None

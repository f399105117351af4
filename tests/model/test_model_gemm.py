"""The C++ row-invariant GEMM (every projection, any row count) against F.linear, and
PackedLinear's choice of path."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from gemm_paths import each_path

from radixkv.model.nn import linear
from radixkv.model.nn.linear import PackedLinear


def _kernels(dtype: torch.dtype) -> Any:
    from radixkv.model.kernels import cpu_kernels, gemm

    assert cpu_kernels() is not None, "the C++ CPU kernels failed to build (see the warning)"
    module = gemm(dtype)
    if module is None:
        pytest.skip(f"this CPU has no GEMM kernel for {dtype}")
    return module


def _tol(dtype: torch.dtype) -> dict[str, float]:
    # bf16: products are exact in f32, sums are f32 in both, the output is rounded once.
    # float32: one sequential chain over K against MKL's blocked sums (K up to 576 here).
    return {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 8, 9, 17, 97, 200])
@pytest.mark.parametrize(("n", "k"), [(16, 64), (96, 576), (48, 10), (40, 300), (72, 1100)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemm_matches_linear(dtype: torch.dtype, m: int, n: int, k: int, with_bias: bool) -> None:
    """Every row tiling (tiles of up to 8 rows, blocks of 96 and 192), K blocks (300 > 256,
    1,100 > 1,024), N not a multiple of 16 (40: a padded block) and odd K in float32, on every
    path the CPU serves for the dtype."""
    mod = _kernels(dtype)
    if dtype == torch.bfloat16 and k % 2:
        pytest.skip("bf16 packs pairs along K")
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = torch.randn(n, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g) if with_bias else None
    packed = mod.gemm_pack(w)
    want = F.linear(x.float(), w.float(), bias)
    for path in each_path(mod, dtype):
        got = mod.gemm(x, packed, n, bias)
        assert got.dtype == dtype and got.shape == (m, n), path
        torch.testing.assert_close(got.float(), want, **_tol(dtype), msg=path)


def test_bfloat16_paths_are_each_their_own_order() -> None:
    """Every bfloat16 path the CPU serves is accurate, and the paths really differ: on 2,000
    outputs of a K = 2,048 product two paths give other bits somewhere (each is one fixed order,
    not one order for all), while each agrees with itself on a row taken alone."""
    mod = _kernels(torch.bfloat16)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(20, 2048, generator=g).to(torch.bfloat16)
    w = (torch.randn(100, 2048, generator=g) / 45).to(torch.bfloat16)
    packed = mod.gemm_pack(w)
    outs = {}
    for path in each_path(mod, torch.bfloat16):
        outs[path] = mod.gemm(x, packed, 100, None)
        assert torch.equal(mod.gemm(x[7:8].contiguous(), packed, 100, None), outs[path][7:8])
        want = F.linear(x.float(), w.float())
        torch.testing.assert_close(outs[path].float(), want, rtol=2e-2, atol=2e-2)
    names = sorted(outs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not torch.equal(outs[a], outs[b]), (a, b)


def test_gemm_rejects_bad_input() -> None:
    mod = _kernels(torch.float32)
    packed = mod.gemm_pack(torch.randn(32, 8))
    with pytest.raises(RuntimeError, match="does not fit"):
        mod.gemm(torch.randn(2, 9), packed, 32, None)
    with pytest.raises(RuntimeError, match="dtype"):
        mod.gemm(torch.randn(2, 8, dtype=torch.float64), packed, 32, None)
    with pytest.raises(RuntimeError, match="contiguous"):
        mod.gemm(torch.randn(8, 2).t(), packed, 32, None)
    with pytest.raises(RuntimeError, match="bias"):
        mod.gemm(torch.randn(2, 8), packed, 32, torch.randn(31))
    assert mod.gemm(torch.randn(0, 8), packed, 32, None).shape == (0, 32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_takes_the_kernel_at_every_row_count(dtype: torch.dtype) -> None:
    """One kernel for 1 row and for 40: the same row alone and inside a batch gives the same
    bits, leading dims kept, results close to F.linear."""
    _kernels(dtype)
    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 32, generator=g).to(dtype)
    b = torch.randn(64, generator=g).to(dtype)
    lin = PackedLinear(w, b)
    assert lin.invariant and not lin.packed
    for shape in [(1, 32), (2, 4, 32), (17, 32), (3, 40, 32)]:
        x = torch.randn(*shape, generator=g).to(dtype)
        got = lin(x)
        assert got.shape == (*shape[:-1], 64)
        torch.testing.assert_close(got.float(), F.linear(x, w, b).float(), **_tol(dtype))
        flat = x.reshape(-1, 32)
        assert torch.equal(lin(flat[-1:]), got.reshape(-1, 64)[-1:])


def test_packed_linear_without_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """No kernel for the dtype (float64) or no kernels at all: oneDNN where it packs, else
    F.linear; not row-invariant, and said so."""
    monkeypatch.setattr(linear, "_gemm_kernels", lambda w: None)
    w = torch.randn(40, 32)
    lin = PackedLinear(w)
    assert not lin.invariant and lin.packed == linear.can_pack(w)
    x = torch.randn(2, 32)
    torch.testing.assert_close(lin(x), F.linear(x, w))
    monkeypatch.undo()
    w64 = torch.randn(16, 8, dtype=torch.float64)
    plain = PackedLinear(w64)
    assert not plain.invariant and not plain.packed
    x64 = torch.randn(3, 8, dtype=torch.float64)
    torch.testing.assert_close(plain(x64), F.linear(x64, w64))


def test_bfloat16_takes_amx_tiles_where_the_cpu_has_them() -> None:
    """On a CPU with AMX (amx_bf16 in /proc/cpuinfo) bfloat16 products whose K is a multiple of
    32 run on AMX tiles (about 8x the AVX-512 kernel at prefill sizes): a build or a permission
    request that silently lost them would fail here."""
    from pathlib import Path

    from radixkv.model.kernels import cpu_kernels

    info = Path("/proc/cpuinfo")
    flags = info.read_text().split() if info.exists() else []
    module = cpu_kernels()
    if module is None or "amx_bf16" not in flags or "avx512_bf16" not in flags:
        pytest.skip("no AMX (amx_bf16) on this CPU, or no kernels")
    assert module.gemm_bf16_amx()


@pytest.mark.parametrize("m", [1, 5, 16, 33, 300, 700])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_gate_up_gives_the_bits_of_product_then_silu_mul(m: int, with_bias: bool) -> None:
    """On AMX the gate/up product applies silu_mul in its epilogue: its bits must equal the plain
    product followed by the silu_mul op (the unfused path, and every path without AMX), for any
    row count (ragged tails, several row panels) and with a bias."""
    from radixkv.model.nn.layers import silu_mul

    g = torch.Generator().manual_seed(m)
    n2, k = 2 * 96, 576
    w = (torch.randn(n2, k, generator=g) * 0.05).to(torch.bfloat16)
    b = torch.randn(n2, generator=g).to(torch.bfloat16) if with_bias else None
    fused = PackedLinear(w, b, silu=True)
    if not fused.silu:
        pytest.skip("no AMX GEMM here: the fused product is not used")
    plain = PackedLinear(w, b)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    want = silu_mul(plain(x))
    got = fused(x)
    assert fused.out_features == 96 and got.shape == (m, 96)
    assert torch.equal(got, want)
    ref = F.silu(F.linear(x.float(), w.float(), None if b is None else b.float()))
    up = F.linear(x.float(), w.float(), None if b is None else b.float())[:, 96:]
    torch.testing.assert_close(got.float(), ref[:, :96] * up, rtol=3e-2, atol=3e-2)

"""The C++ element-wise kernels Gemma 3 and Qwen3.5 take on CPU (`rms_norm_1p`, `gelu_tanh_mul`
in radixkv.model.kernels' pointwise.cpp), through the model's ops: close to the torch formulas
they replace (the Hugging Face reference's arithmetic), every row of a batch the same bits as
that row alone, and the ops dispatching to them only where they serve."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixkv.model.kernels import pointwise
from radixkv.model.nn import layers

pytestmark = pytest.mark.skipif(pointwise() is None, reason="the C++ kernels do not build here")
DTYPES = (torch.float32, torch.bfloat16)
# (atol, rtol): bfloat16 results may differ from torch's by one rounding of an intermediate.
TOL = {torch.float32: (2e-6, 1e-5), torch.bfloat16: (1e-2, 1e-2)}


def _rows_alone(fn, x: torch.Tensor) -> bool:  # type: ignore[no-untyped-def]
    full = fn(x)
    return all(torch.equal(full[i : i + 1], fn(x[i : i + 1])) for i in range(x.shape[0]))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(13, 640), (6, 4, 256), (3, 1152)], ids=str)
def test_rms_norm_1p(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, generator=g).to(dtype)
    w = (torch.randn(shape[-1], generator=g) * 0.5).to(dtype)
    got = layers.rms_norm_1p(x, w, 1e-6)
    want = layers.rms_norm_1p_torch(x, w, 1e-6)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    assert _rows_alone(lambda t: layers.rms_norm_1p(t, w, 1e-6), x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gelu_tanh_mul(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(2)
    gu = (torch.randn(11, 2 * 1000, generator=g) * 3).to(dtype)
    gate, up = gu.chunk(2, dim=-1)
    got = layers.gelu_mul(gu, tanh=True)
    want = F.gelu(gate, approximate="tanh") * up
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got, want, atol=10 * atol, rtol=rtol)
    assert _rows_alone(lambda t: layers.gelu_mul(t, tanh=True), gu)
    # Near 0 the sigmoid form keeps full relative precision.
    small = torch.linspace(-1e-3, 1e-3, 2000, dtype=torch.float64)
    gu0 = torch.cat((small, torch.ones(2000, dtype=torch.float64)))[None].float()
    exact = F.gelu(small, approximate="tanh").float()[None]
    assert ((layers.gelu_mul(gu0, tanh=True) - exact).abs() <= 2e-7 * exact.abs() + 1e-12).all()


def test_the_ops_take_the_kernels_where_they_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    k = pointwise()

    class Spy:
        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            calls.append(name)
            return getattr(k, name)

    monkeypatch.setattr(layers, "_cpp", lambda x: Spy())
    x, w = torch.randn(2, 64), torch.randn(64)
    layers.rms_norm_1p(x, w, 1e-6)
    layers.gelu_mul(torch.randn(2, 64), tanh=True)
    layers.gelu_mul(torch.randn(2, 64), tanh=False)  # the exact GELU: torch's formula
    layers.rms_norm_1p(x, w.double(), 1e-6)  # a weight in another dtype: torch's formula
    assert calls == ["rms_norm_1p", "gelu_tanh_mul"]

"""Stateless building blocks shared by every family: RMSNorm (and Gemma's (1 + w) variant),
SiLU * up, GELU * up and rotary position embeddings, as `radixkv::` custom ops.

On CPU they run the C++ kernels of `radixkv.model.kernels` (pointwise.cpp): one fixed arithmetic
per row, so a token's result does not depend on the batch, and the eager and compiled model give
the same bits (inductor treats the ops as opaque calls instead of re-deriving their arithmetic).
On CUDA they run the Triton kernels of `radixkv.model.triton.pointwise` (one launch per op, the
torch formulas' rounding; $RADIXKV_TRITON_POINTWISE=0 turns them off). Elsewhere, and where
neither can run, they run the torch formulas below. GELU * up with the exact (erf) GELU, and on
CUDA any GELU, has no kernel: its torch formula computes each element on its own, so it is
row-invariant in eager torch too, and as a custom op the compiler does not rewrite it either.

Numerics follow the Hugging Face reference so that float32 logits agree to ~1e-5: the norm runs in
float32 and casts back before the weight multiply; RoPE angles are computed in float32 from the
integer positions and cast to the activation dtype.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F

from radixkv.model.nn.linear import LIB


@cache
def _kernels() -> Any:
    from radixkv.model.kernels import pointwise

    return pointwise()


def _cpp(x: torch.Tensor) -> Any:
    """The C++ kernels for x, or None (not on CPU, or not built)."""
    return _kernels() if x.device.type == "cpu" else None


@cache
def _triton_module() -> Any:
    if os.environ.get("RADIXKV_TRITON_POINTWISE", "1") == "0":
        return None
    try:
        from radixkv.model.triton import pointwise
    except ImportError:
        return None
    return pointwise


def _gpu(x: torch.Tensor) -> Any:
    """The Triton kernels for x (a CUDA tensor they take), or None."""
    if x.device.type != "cuda":
        return None
    mod = _triton_module()
    return mod if mod is not None and mod.supports(x) else None


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rms_norm_impl(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    g = _gpu(x)
    if g is not None and weight.dtype == x.dtype and weight.shape == x.shape[-1:]:
        return g.rms_norm(x, weight, eps)
    k = _cpp(x)
    if k is None or weight.dtype != x.dtype or weight.shape != x.shape[-1:]:
        return rms_norm_torch(x, weight, eps)
    return k.rms_norm(x, weight, eps)


def _silu_mul_impl(gate_up: torch.Tensor) -> torch.Tensor:
    g = _gpu(gate_up)
    if g is not None:
        return g.silu_mul(gate_up)
    k = _cpp(gate_up)
    if k is not None:
        return k.silu_mul(gate_up)
    return silu_mul_torch(gate_up)


def silu_mul_torch(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in torch's element-wise ops (the formula the kernels follow)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _rope_impl(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    g = _gpu(x)
    if g is not None and g.rope_ok(x, cos, sin):
        return g.rope(x, cos, sin)
    k = _cpp(x)
    if k is not None and x.dim() == 3 and cos.dtype == sin.dtype == x.dtype:
        return k.rope(x, cos, sin)
    return rope_torch(x, cos, sin)


def rope_torch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in torch's element-wise ops: (x1 c - x2 s, x2 c + x1 s) per half."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :half], sin[:, None, :half]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def rms_norm_1p_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma-style RMSNorm: float32 statistics, scaled by (1 + weight) in float32, cast back."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (1.0 + weight.float())).to(x.dtype)


def _rms_norm_1p_impl(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    g = _gpu(x)
    if g is not None and weight.shape == x.shape[-1:] and weight.stride(-1) == 1:
        return g.rms_norm(x, weight, eps, one_plus=True)
    k = _cpp(x)
    if k is None or weight.dtype != x.dtype or weight.shape != x.shape[-1:]:
        return rms_norm_1p_torch(x, weight, eps)
    return k.rms_norm_1p(x, weight, eps)


def _gelu_mul_impl(gate_up: torch.Tensor, tanh: bool) -> torch.Tensor:
    k = _cpp(gate_up)
    if k is not None and tanh:
        return k.gelu_tanh_mul(gate_up)
    return gelu_mul_torch(gate_up, tanh)


def gelu_mul_torch(gate_up: torch.Tensor, tanh: bool) -> torch.Tensor:
    """gelu(gate) * up in torch's element-wise ops."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh" if tanh else "none") * up


LIB.define("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor")
LIB.define("rms_norm_1p(Tensor x, Tensor weight, float eps) -> Tensor")
LIB.define("gelu_mul(Tensor gate_up, bool tanh) -> Tensor")
LIB.define("silu_mul(Tensor gate_up) -> Tensor")
LIB.define("rope(Tensor x, Tensor cos, Tensor sin) -> Tensor")
LIB.impl("rms_norm", _rms_norm_impl, "CompositeExplicitAutograd")
LIB.impl("rms_norm_1p", _rms_norm_1p_impl, "CompositeExplicitAutograd")
LIB.impl("silu_mul", _silu_mul_impl, "CompositeExplicitAutograd")
LIB.impl("gelu_mul", _gelu_mul_impl, "CompositeExplicitAutograd")
LIB.impl("rope", _rope_impl, "CompositeExplicitAutograd")


def _silu_mul_fake(gate_up: torch.Tensor) -> torch.Tensor:
    return gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))


torch.library.register_fake(
    "radixkv::rms_norm", lambda x, weight, eps: torch.empty_like(x), lib=LIB
)
torch.library.register_fake(
    "radixkv::rms_norm_1p", lambda x, weight, eps: torch.empty_like(x), lib=LIB
)
torch.library.register_fake("radixkv::silu_mul", _silu_mul_fake, lib=LIB)
torch.library.register_fake(
    "radixkv::gelu_mul", lambda gate_up, tanh: _silu_mul_fake(gate_up), lib=LIB
)
torch.library.register_fake(
    "radixkv::rope",
    lambda x, cos, sin: x.new_empty(x.shape),
    lib=LIB,
)


# torch's CPU element-wise loops run 2 x 512-bit vectors at a time (32 floats, 64 bf16) and the
# remainder through a scalar tail whose sigmoid / SiLU / softplus / GELU can round differently.
LANES = 64


def lanewise(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fn(x) for an element-wise fn over rows of x [..., n], with every row padded to a multiple
    of LANES, so each element takes torch's vector path whatever the row count (a [T, 1] gate
    would otherwise take the scalar tail alone and the vector path in a batch)."""
    n = x.shape[-1]
    if n % LANES == 0:
        return fn(x)
    return fn(F.pad(x, (0, LANES - n % LANES)))[..., :n]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim (float32 statistics, result in x's dtype times `weight`)."""
    return torch.ops.radixkv.rms_norm(x, weight, eps)


def rms_norm_1p(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma / Qwen3.5 RMSNorm: float32 statistics times (1 + weight) in float32, cast back."""
    return torch.ops.radixkv.rms_norm_1p(x, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up = [gate | up] along the last dim."""
    return torch.ops.radixkv.silu_mul(gate_up)


def gelu_mul(gate_up: torch.Tensor, tanh: bool) -> torch.Tensor:
    """gelu(gate) * up (tanh approximation if `tanh`) for gate_up = [gate | up]."""
    return torch.ops.radixkv.gelu_mul(gate_up, tanh)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] (float32) for plain, `linear` or `llama3` RoPE."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    rope_type = scaling["rope_type"]
    factor = float(scaling["factor"])
    if rope_type == "linear":
        return inv_freq / factor
    if rope_type != "llama3":
        raise ValueError(f"unsupported rope type {rope_type!r}")
    low = float(scaling["low_freq_factor"])
    high = float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are divided by `factor`, short ones kept, the band between interpolated.
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [T, head_dim] for the given positions (half-rotation layout)."""
    freqs = positions.float()[:, None] * inv_freq.to(positions.device)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, head_dim] by per-token angles (HF `rotate_half` convention:
    x * cos + rotate_half(x) * sin, written per half: (x1 c - x2 s, x2 c + x1 s); the two halves
    of the cos/sin tables are equal)."""
    return torch.ops.radixkv.rope(x, cos, sin)

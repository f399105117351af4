"""Stateless building blocks shared by the Llama family: RMSNorm and rotary position embeddings.

Numerics follow the Hugging Face reference so that float32 logits agree to ~1e-5: the norm runs in
float32 and casts back before the weight multiply; RoPE angles are computed in float32 from the
integer positions and cast to the activation dtype.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim (float32 statistics, result in x's dtype times `weight`)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


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
    x * cos + rotate_half(x) * sin, written per half so that no rotated copy of x is built and
    the compiler fuses it into one loop; the two halves of the cos/sin tables are equal)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :half], sin[:, None, :half]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

"""The model's element-wise ops as Triton kernels, for CUDA devices: RMSNorm (and the (1 + w)
variant), SiLU * up and RoPE, one launch each where torch's formulas take three to seven.

Why: on a GPU a decode step of a small model is a few hundred tiny kernels, and each costs a
launch on the host and a few µs on the device whatever its size; the first device run (issue 35)
measured a 1B decode step at batch 32 as 708 kernels, of which these formulas were most.

Arithmetic: each follows the torch formula of radixkv.model.nn.layers, rounding where it rounds,
so that a token's result never depends on the batch (one program computes one row, or one block
of a row, alone, in a fixed order):
- `rms_norm`: float32 statistics (the row's sum of squares in one fixed-order reduction), the
  normalized row cast to x's dtype, times the weight in x's dtype; `rms_norm_1p` multiplies by
  (1 + w) in float32 and casts once;
- `silu_mul`: silu(gate) rounded to gate's dtype, times up, rounded;
- `rope`: (x1 c - x2 s, x2 c + x1 s) with every product and sum rounded to x's dtype, as torch's
  element-wise ops do; FMA contraction is off, so a float32 result equals torch's bit for bit.
Inputs: CUDA tensors (or any, under Triton's interpreter in the tests) whose last dim is
contiguous; `supports(x)` says whether the launchers take x. The callers in layers.py fall back
to torch otherwise.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixkv.model.triton.interpreter import interpreting

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_OPTS = {"enable_fp_fusion": False}
BLOCK_COLS = 1024  # columns per program of silu_mul


def supports(x: torch.Tensor) -> bool:
    """Whether the launchers take x: a float tensor on CUDA (or any device under the
    interpreter) with a contiguous last dim."""
    on_device = x.device.type == "cuda" or interpreting()
    return on_device and x.dtype in _DTYPES and x.dim() >= 2 and x.stride(-1) == 1


@triton.jit
def _rms_norm_kernel(
    X, W, Out, stride_x, stride_o, n, eps,
    BLOCK: tl.constexpr, ONE_PLUS: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / n + eps)
    w = tl.load(W + cols, mask=ok, other=0.0)
    if ONE_PLUS:
        y = (xf * inv * (1.0 + w.to(tl.float32))).to(x.dtype)
    else:
        y = (w.to(tl.float32) * (xf * inv).to(x.dtype).to(tl.float32)).to(x.dtype)
    tl.store(Out + row * stride_o + cols, y, mask=ok)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, one_plus: bool = False
) -> torch.Tensor:
    """RMSNorm of x's rows (see the module docstring); weight [n] in x's dtype (float32 is
    taken too for `one_plus`)."""
    n = x.shape[-1]
    rows = x.reshape(-1, n)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        block = triton.next_power_of_2(n)
        _rms_norm_kernel[(rows.shape[0],)](
            rows, weight, out, rows.stride(0), out.stride(0), n, eps,
            BLOCK=block, ONE_PLUS=one_plus, num_warps=8 if block >= 4096 else 4, **_OPTS,
        )  # fmt: skip
    return out.view(x.shape)


@triton.jit
def _silu_mul_kernel(GU, Out, stride_gu, stride_o, n, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n
    g = tl.load(GU + row * stride_gu + cols, mask=ok, other=0.0)
    u = tl.load(GU + row * stride_gu + n + cols, mask=ok, other=0.0)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)
    y = (act.to(tl.float32) * u.to(tl.float32)).to(g.dtype)
    tl.store(Out + row * stride_o + cols, y, mask=ok)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up = [gate | up] along the last dim."""
    n = gate_up.shape[-1] // 2
    rows = gate_up.reshape(-1, 2 * n)
    out = torch.empty((rows.shape[0], n), dtype=gate_up.dtype, device=gate_up.device)
    if rows.shape[0]:
        grid = (rows.shape[0], triton.cdiv(n, BLOCK_COLS))
        _silu_mul_kernel[grid](
            rows, out, rows.stride(0), out.stride(0), n, BLOCK=BLOCK_COLS, **_OPTS
        )
    return out.view(*gate_up.shape[:-1], n)


@triton.jit
def _rope_kernel(
    X, Cos, Sin, Out, heads, stride_xt, stride_xh, stride_ct, stride_ot, stride_oh,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    tok = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    ok = (h < heads)[:, None] & (d < HALF)[None, :]
    src = X + tok * stride_xt + h[:, None] * stride_xh + d[None, :]
    x1 = tl.load(src, mask=ok, other=0.0)
    x2 = tl.load(src + HALF, mask=ok, other=0.0)
    c = tl.load(Cos + tok * stride_ct + d, mask=d < HALF, other=0.0)[None, :]
    s = tl.load(Sin + tok * stride_ct + d, mask=d < HALF, other=0.0)[None, :]
    dt = x1.dtype
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    cf, sf = c.to(tl.float32), s.to(tl.float32)
    a = (f1 * cf).to(dt).to(tl.float32)
    b = (f2 * sf).to(dt).to(tl.float32)
    e = (f2 * cf).to(dt).to(tl.float32)
    g = (f1 * sf).to(dt).to(tl.float32)
    dst = Out + tok * stride_ot + h[:, None] * stride_oh + d[None, :]
    tl.store(dst, (a - b).to(dt), mask=ok)
    tl.store(dst + HALF, (e + g).to(dt), mask=ok)


def rope_ok(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether `rope` takes these: x [T, H, D] (any token and head strides), cos/sin [T, D]
    in x's dtype with the same strides, contiguous last dims."""
    return (
        supports(x)
        and x.dim() == 3
        and cos.dtype == sin.dtype == x.dtype
        and cos.shape == sin.shape == (x.shape[0], x.shape[2])
        and cos.stride() == sin.stride()
        and cos.stride(-1) == 1
    )


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] rotated by cos/sin [T, D] (half-rotation layout); a new contiguous tensor."""
    tokens, heads, dim = x.shape
    out = torch.empty((tokens, heads, dim), dtype=x.dtype, device=x.device)
    if tokens:
        half = dim // 2
        block_h = min(triton.next_power_of_2(heads), 16)
        grid = (tokens, triton.cdiv(heads, block_h))
        _rope_kernel[grid](
            x, cos, sin, out, heads, x.stride(0), x.stride(1), cos.stride(0),
            out.stride(0), out.stride(1),
            HALF=half, BLOCK_H=block_h, BLOCK_D=triton.next_power_of_2(half), **_OPTS,
        )  # fmt: skip
    return out

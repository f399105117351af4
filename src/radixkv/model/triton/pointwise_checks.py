"""The checks the Triton element-wise kernels (pointwise.py) must pass, shared by the unit tests
(CPU, under the interpreter) and the device script (scripts/gpu_triton.py, compiled on a GPU):

- each op against its torch formula (radixkv.model.nn.layers), within the dtype's tolerance; RoPE
  and SiLU * up in float32 bit for bit where their formulas use no transcendental (RoPE);
- row invariance: every row of a batch equals that row computed alone, bit for bit, in every
  dtype (what the one-answer property needs of them).
Shapes are the default model's and the 1B shape's (hidden 576 / 2,048, heads of 64), a q that is
a strided view of a fused QKV projection included.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from radixkv.model.nn import layers
from radixkv.model.triton import pointwise

# (atol, rtol) against the torch formula: 16-bit results may differ by a rounding step, where
# the formula rounds an intermediate the kernel keeps (the norm's statistics, exp's last bit).
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}
DTYPES = (torch.float32, torch.bfloat16)


def _norm_torch(x: torch.Tensor, w: torch.Tensor, eps: float, one_plus: bool) -> torch.Tensor:
    return layers.rms_norm_1p_torch(x, w, eps) if one_plus else layers.rms_norm_torch(x, w, eps)


@dataclass(frozen=True)
class Problem:
    """`fn(*args)` against `ref(*args)`; the args at `per_row` are sliced to take one row."""

    name: str
    fn: Callable[..., torch.Tensor]
    ref: Callable[..., torch.Tensor]
    args: tuple[Any, ...]
    per_row: tuple[int, ...] = (0,)

    def row(self, i: int) -> torch.Tensor:
        args = [a[i : i + 1] if j in self.per_row else a for j, a in enumerate(self.args)]
        return self.fn(*args)


def problems(dtype: torch.dtype, device: str | torch.device) -> list[Problem]:
    """Random inputs of the model shapes, for every op."""
    g = torch.Generator().manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    out = []
    for hidden, heads, kv in ((576, 9, 3), (2048, 32, 8)):
        x, w = rnd(7, hidden), rnd(hidden)
        out.append(Problem(f"rms_norm-{hidden}", pointwise.rms_norm,
                           lambda x, w, e: _norm_torch(x, w, e, False), (x, w, 1e-5)))  # fmt: skip
        out.append(Problem(f"rms_norm_1p-{hidden}",
                           lambda x, w, e: pointwise.rms_norm(x, w, e, one_plus=True),
                           lambda x, w, e: _norm_torch(x, w, e, True), (x, w, 1e-6)))  # fmt: skip
        gu = rnd(5, 2 * (4 * hidden // 3))
        out.append(Problem(f"silu_mul-{hidden}", pointwise.silu_mul, layers.silu_mul_torch, (gu,)))
        qkv = rnd(6, (heads + 2 * kv) * 64)
        q = qkv[:, : heads * 64].view(6, heads, 64)  # a strided view, as the model has it
        ang = torch.rand(6, 32, generator=g) * 100
        cos = torch.cat((ang, ang), -1).cos().to(dtype).to(device)
        sin = torch.cat((ang, ang), -1).sin().to(dtype).to(device)
        out.append(Problem(f"rope-{heads}x64", pointwise.rope, layers.rope_torch, (q, cos, sin),
                           per_row=(0, 1, 2)))  # fmt: skip
    return out


def pointwise_results(device: str | torch.device = "cpu") -> list[dict[str, Any]]:
    """Every problem in every dtype: max difference to torch, within tolerance, rows invariant
    (each row of the batch equals that row alone, bit for bit), and for float32 RoPE bit
    equality with torch."""
    rows = []
    for dtype in DTYPES:
        atol, rtol = TOLERANCE[dtype]
        for p in problems(dtype, device):
            got, want = p.fn(*p.args), p.ref(*p.args)
            n = got.shape[0]
            row = {
                "op": p.name, "dtype": str(dtype).removeprefix("torch."),
                "max_diff": float((got.float() - want.float()).abs().max()),
                "within_tolerance": torch.allclose(got.float(), want.float(), atol=atol,
                                                   rtol=rtol),
                "rows_invariant": all(torch.equal(got[i : i + 1], p.row(i)) for i in range(n)),
            }  # fmt: skip
            if dtype == torch.float32 and p.name.startswith("rope"):
                row["equal_torch"] = torch.equal(got, want)
            rows.append(row)
    return rows

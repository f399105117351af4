"""The blocks every family is built from: the weights helper, attention and the gated MLP.

Each projection is a `PackedLinear` (the row-invariant C++ GEMM where it serves the weight, see
radixkv.model.nn.linear), fused at load time (Q/K/V into one matrix, gate/up into one), and every
row-wise step is a `radixkv::` custom op (radixkv.model.nn.layers). A block makes its two kinds of
non-element-wise calls through `LayerOps` (a projection, attention over the pools), so the same
block runs eagerly and inside the compiled stack (radixkv.model.nn.compiled).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from radixkv.model.nn.layers import apply_rope, gelu_mul, rms_norm, rms_norm_1p, silu_mul
from radixkv.model.nn.linear import PackedLinear

# Returns the HF tensor of that name (already on the target device/dtype), or None if absent.
WeightGetter = Callable[[str], "torch.Tensor | None"]
NORMS: dict[str, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    "rms": rms_norm,  # weight * x_normed (Llama, LFM2)
    "rms_1p": rms_norm_1p,  # (1 + weight) * x_normed (Gemma 3, Qwen3.5)
}


def param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.contiguous(), requires_grad=False)


class Weights:
    """`need(name)` / `maybe(name)` / `linear(*names)` under a prefix, over a getter."""

    def __init__(self, get: WeightGetter, prefix: str = "") -> None:
        self.get, self.prefix = get, prefix

    def need(self, name: str) -> nn.Parameter:
        t = self.get(self.prefix + name)
        if t is None:
            raise KeyError(f"checkpoint is missing {self.prefix + name}")
        return param(t)

    def maybe(self, name: str) -> nn.Parameter | None:
        t = self.get(self.prefix + name)
        return None if t is None else param(t)

    def sub(self, prefix: str) -> Weights:
        return Weights(self.get, self.prefix + prefix)

    def linear(self, *names: str, bias: bool | None = False, silu: bool = False) -> PackedLinear:
        """One projection over the named ones stacked by output rows (`q_proj`, `k_proj`, ... :
        their `.weight`s). `bias`: True = each has a `.bias`, None = used if all have one,
        False = none. `silu`: the two are gate and up, fused with silu_mul where the kernel can
        (see PackedLinear)."""
        weight = torch.cat([self.need(n + ".weight").detach() for n in names])
        biases = [self.get(self.prefix + n + ".bias") for n in names] if bias is not False else []
        missing = [n for n, b in zip(names, biases, strict=True) if b is None] if bias else []
        if missing:
            raise KeyError(f"checkpoint is missing {self.prefix}{missing[0]}.bias")
        have = bool(biases) and all(b is not None for b in biases)
        bias_t = torch.cat(biases) if have else None  # type: ignore[arg-type]
        return PackedLinear(weight, bias_t, silu=silu)


class LayerOps(Protocol):
    """The two calls a decoder layer makes that are not element-wise: a projection, and
    attention over the pools (which also stores this step's K/V) for attention layer `layer`
    (its index in the model)."""

    def linear(self, lin: PackedLinear, x: torch.Tensor) -> torch.Tensor: ...

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor: ...


class EagerLinear:
    """`linear` as a plain call (the eager half of LayerOps)."""

    def linear(self, lin: PackedLinear, x: torch.Tensor) -> torch.Tensor:
        return lin(x)


EAGER = EagerLinear()


@dataclass(frozen=True)
class AttentionSpec:
    """What differs between the families' attention blocks."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float = 1e-6
    qkv_bias: bool | None = False  # None: if the checkpoint has them
    o_bias: bool | None = False
    qk_norm: str | None = None  # a NORMS key, per head on Q and K before RoPE
    q_norm: str = "q_norm"
    k_norm: str = "k_norm"
    o_proj: str = "o_proj"
    rotary_dim: int | None = None  # RoPE on the first rotary_dim features (None: all)
    output_gate: bool = False  # q_proj also yields a per-head gate: o * sigmoid(gate) (Qwen3.5)


class Attention(nn.Module):
    """Fused QKV projection → optional per-head Q/K norm → RoPE → attention (via ops, which
    writes K/V to the pools first) → optional output gate → output projection."""

    def __init__(self, spec: AttentionSpec, index: int, w: Weights) -> None:
        super().__init__()
        self.spec, self.index = spec, index
        self.q_size = spec.num_heads * spec.head_dim
        self.kv_size = spec.num_kv_heads * spec.head_dim
        self.qkv = w.linear("q_proj", "k_proj", "v_proj", bias=spec.qkv_bias)
        self.o_proj = w.linear(spec.o_proj, bias=spec.o_bias)
        norm = spec.qk_norm is not None
        self.q_norm = w.need(spec.q_norm + ".weight") if norm else None
        self.k_norm = w.need(spec.k_norm + ".weight") if norm else None
        self.norm = NORMS[spec.qk_norm] if spec.qk_norm is not None else None

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rot = self.spec.rotary_dim
        if rot is None or rot == x.shape[-1]:
            return apply_rope(x, cos, sin)
        return torch.cat([apply_rope(x[..., :rot].contiguous(), cos, sin), x[..., rot:]], dim=-1)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ops: LayerOps
    ) -> torch.Tensor:
        """h [T, hidden] (already normed) → the attention block's output [T, hidden]."""
        s, t = self.spec, h.shape[0]
        q_width = 2 * self.q_size if s.output_gate else self.q_size
        q, k, v = ops.linear(self.qkv, h).split([q_width, self.kv_size, self.kv_size], dim=-1)
        gate = None
        if s.output_gate:  # per head: head_dim query features, then head_dim gate features
            q, gate = q.reshape(t, s.num_heads, 2 * s.head_dim).split(s.head_dim, dim=-1)
        q = q.reshape(t, s.num_heads, s.head_dim)
        k = k.reshape(t, s.num_kv_heads, s.head_dim)
        v = v.reshape(t, s.num_kv_heads, s.head_dim)
        if self.norm is not None and self.q_norm is not None and self.k_norm is not None:
            q = self.norm(q, self.q_norm, s.eps)
            k = self.norm(k, self.k_norm, s.eps)
        q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
        o = ops.attend(self.index, q, k, v).reshape(t, self.q_size).to(h.dtype)
        if gate is not None:
            o = o * torch.sigmoid(gate.reshape(t, self.q_size))
        return ops.linear(self.o_proj, o)


class GatedMLP(nn.Module):
    """down(act(gate(h)) * up(h)) with gate and up fused; act is SiLU or GELU (tanh or exact)."""

    def __init__(
        self,
        w: Weights,
        act: str = "silu",
        names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
        bias: bool = False,
    ) -> None:
        super().__init__()
        if act not in ("silu", "gelu", "gelu_tanh"):
            raise ValueError(f"unsupported MLP activation {act!r}")
        self.act = act
        self.gate_up = w.linear(names[0], names[1], bias=bias, silu=act == "silu")
        self.down = w.linear(names[2], bias=bias)

    def forward(self, h: torch.Tensor, ops: LayerOps | EagerLinear = EAGER) -> torch.Tensor:
        gate_up = ops.linear(self.gate_up, h)
        if self.gate_up.silu:  # the product already applied silu_mul (same bits)
            act = gate_up
        elif self.act == "silu":
            act = silu_mul(gate_up)
        else:
            act = gelu_mul(gate_up, self.act == "gelu_tanh")
        return ops.linear(self.down, act)

"""A model's standard decoder layers as one C++ call (`kernels/stack.cpp`).

The eager layer makes about twenty calls per layer (norms, projections, RoPE, the pool write,
attention, residual adds), each through the Python interpreter and torch's dispatcher; on the
default model that overhead was about a third of a decode step. `NativeStack` hands the same
calls, on the same tensors and in the same order, to a C++ loop over the layers, so its output
is bit-identical to the eager layers' (tests/model/test_native_stack.py checks it in float32
and bfloat16, for decode, prefill, chunked and mixed batches) and only the overhead goes.

It serves a model of any family whose every layer describes itself to it (`native_layer()`, a
`NativeLayer`: the skeleton's standard `DecoderLayer`, and Gemma 3's sandwich-norm layer), all of
one shape, and which the C++ kernels cover: the row-invariant GEMM for every projection, RMSNorm
or the (1 + w) RMSNorm (optionally per-head on Q and K, optionally on each block's output), RoPE
on the whole head, a SiLU or GELU-tanh MLP, the C++ decode and extend attention kernels (the
`TorchAttention` backend with both: the stack is that backend's fused form, and makes its KV
write, at the metadata's out slots, inside the C++ layer loop), one attention scale; and pools
that hold K/V in the model's dtype. Each layer reads and writes one KV component (FULL or SWA,
Gemma 3 both), with that component's RoPE table, out slots and metadata. Anything else (another
backend, state layers, a partial rotary dim, the kernels off, a compiled model) keeps the eager
(or compiled) path. $RADIXKV_NATIVE_STACK=0 turns it off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch

from radixkv.model.attention import TorchAttention

if TYPE_CHECKING:
    from radixkv.model.attention import KVStep
    from radixkv.model.families.skeleton import DecoderLM, Rope
    from radixkv.model.nn.blocks import Attention, GatedMLP


@dataclass(frozen=True)
class NativeLayer:
    """A decoder layer as the C++ stack computes it: x += out_norm(attn(in_norm(x))), then
    x += mlp_out_norm(mlp(post_norm(x))); the out norms are absent in a pre-norm block, every
    norm is the (1 + w) RMSNorm when `one_plus`."""

    attn: Attention
    mlp: GatedMLP
    eps: float  # of every norm of the layer (the per-head ones too: checked)
    in_norm: torch.Tensor
    post_norm: torch.Tensor  # before the MLP
    attn_out_norm: torch.Tensor | None = None
    mlp_out_norm: torch.Tensor | None = None
    one_plus: bool = False

    def norms(self) -> list[torch.Tensor | None]:
        a = self.attn
        out = [self.in_norm, self.post_norm, a.q_norm, a.k_norm]
        return [None if n is None else n.detach() for n in [*out, *self.out_norms()]]

    def out_norms(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self.attn_out_norm, self.mlp_out_norm


def _layer_ok(layer: NativeLayer, dtype: torch.dtype) -> bool:
    """Whether the C++ stack computes this layer exactly as its eager forward does."""
    attn, mlp, spec = layer.attn, layer.mlp, layer.attn.spec
    projections = (attn.qkv, attn.o_proj, mlp.gate_up, mlp.down)
    qk_norm = "rms_1p" if layer.one_plus else "rms"
    return (
        all(p.invariant for p in projections)
        and spec.qk_norm in (None, qk_norm)
        and not spec.output_gate
        and spec.rotary_dim in (None, spec.head_dim)
        and spec.head_dim % 16 == 0
        and spec.head_dim <= 256
        and mlp.act in ("silu", "gelu_tanh")
        and (spec.qk_norm is None or spec.eps == layer.eps)
        and all(n is None or (n.dtype == dtype and n.dim() == 1) for n in layer.norms())
    )


def _shape(layer: NativeLayer) -> tuple[int, int, int, float]:
    s = layer.attn.spec
    return (s.num_heads, s.num_kv_heads, s.head_dim, layer.eps)


def native_layers(model: DecoderLM[Any]) -> list[NativeLayer] | None:
    """Every layer's `native_layer()` description, or None if one layer has none."""
    out = []
    for layer in model.layers:
        describe = getattr(layer, "native_layer", None)
        native = describe() if describe is not None else None
        if native is None:
            return None
        out.append(native)
    return out


class NativeStack:
    """`stack(x, ropes, ctx)` = the decoder layers applied in order, in one C++ call (`ropes`:
    each KV component's RoPE table). Build with `NativeStack.of(model)` (None where it cannot
    serve the model); `serves(x, ropes, ctx)` says whether it can run a given forward."""

    def __init__(self, impl: Any, kinds: list[str], where: list[tuple[str, int]]) -> None:
        self.impl = impl
        self.kinds = kinds  # the KV components, in the C++ stack's component order
        self.where = where  # per layer: its component and its layer in that pool

    @classmethod
    def of(cls, model: DecoderLM[Any]) -> NativeStack | None:
        if os.environ.get("RADIXKV_NATIVE_STACK", "1") == "0" or model.device.type != "cpu":
            return None
        backend = model.attention
        if not (
            isinstance(backend, TorchAttention)
            and backend.decode_kernel is not None
            and backend.extend_kernel is not None
        ):
            return None
        from radixkv.model.kernels import cpu_kernels

        module = cpu_kernels()
        layers = native_layers(model)
        if module is None or not hasattr(module, "DecoderStack") or not layers:
            return None
        shape = _shape(layers[0])
        scales = {at.scale for at in model.attn_layers.values()}
        if (
            len(scales) != 1
            or len(model.attn_layers) != len(layers)
            or not all(_layer_ok(x, model.dtype) and _shape(x) == shape for x in layers)
        ):
            return None
        ats = [model.attn_layers[i] for i in range(len(layers))]
        where = [(at.kind, at.pool_layer) for at in ats]
        kinds = list(dict.fromkeys(kind for kind, _ in where))
        impl = module.DecoderStack(*shape, scales.pop())
        for i, layer in enumerate(layers):
            attn, mlp = layer.attn, layer.mlp
            projections = (attn.qkv, attn.o_proj, mlp.gate_up, mlp.down)
            impl.add_layer(
                layer.norms(),
                [p.weight for p in projections],
                [p.product_outputs for p in projections],
                [p.bias_f32 for p in projections],
                [layer.one_plus, mlp.act == "gelu_tanh", mlp.gate_up.silu],
                ats[i].window or 0,
                kinds.index(where[i][0]),
            )
        return cls(impl, kinds, where)

    def serves(self, x: torch.Tensor, ropes: dict[str, Rope], ctx: KVStep) -> bool:
        """Whether this forward fits (the backend was checked once, in `of`): every component
        the layers use is in this step, with cos/sin and its pool in x's dtype on the CPU."""
        if set(self.kinds) - set(ctx.pools) or set(self.kinds) - set(ropes):
            return False
        for kind in self.kinds:
            pool = ctx.pools[kind]
            if (
                ropes[kind].cos.dtype != x.dtype
                or pool.config.dtype != x.dtype
                or torch.device(pool.config.device).type != "cpu"
            ):
                return False
        return all(j < len(ctx.pools[kind].k) for kind, j in self.where)

    def __call__(self, x: torch.Tensor, ropes: dict[str, Rope], ctx: KVStep) -> torch.Tensor:
        # The backend's fused form: the C++ loop writes K/V at the metadata's out slots and
        # makes the backend's kernel calls (TorchAttention.stack_args), per component.
        backend = cast(TorchAttention, ctx.backend)
        args: list[Any] = [backend.stack_args(ctx.meta[kind]) for kind in self.kinds]
        out_slots, rows, slots, lens, ext = (list(part) for part in zip(*args, strict=True))
        out: torch.Tensor = self.impl.forward(
            x,
            [ropes[kind].cos for kind in self.kinds],
            [ropes[kind].sin for kind in self.kinds],
            [ctx.pools[kind].k[j] for kind, j in self.where],
            [ctx.pools[kind].v[j] for kind, j in self.where],
            out_slots,
            rows,
            slots,
            lens,
            [list(e) for e in ext],
        )
        return out

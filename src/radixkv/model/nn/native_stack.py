"""A model's standard decoder layers as one C++ call (`kernels/stack.cpp`).

The eager layer makes about twenty calls per layer (norms, projections, RoPE, the pool write,
attention, residual adds), each through the Python interpreter and torch's dispatcher; on the
default model that overhead was about a third of a decode step. `NativeStack` hands the same
calls, on the same tensors and in the same order, to a C++ loop over the layers, so its output
is bit-identical to the eager layers' (tests/model/test_native_stack.py checks it in float32
and bfloat16, for decode, prefill, chunked and mixed batches) and only the overhead goes.

It serves a model of any family whose every layer is the skeleton's standard, stackable
`DecoderLayer` (radixkv.model.families.skeleton), all of one shape, and which the C++ kernels
cover: the row-invariant GEMM for every projection, RMSNorm (optionally per-head on Q and K),
RoPE on the whole head, SiLU MLP, the C++ decode and extend attention kernels (the
`TorchAttention` backend with both: the stack is that backend's fused form, and makes its KV
write, at the metadata's out slots, inside the C++ layer loop), one attention scale; and a
forward over one KV component (FULL, or SWA for an all-sliding model) whose pool holds K/V in
the model's dtype. Anything else (another backend, other layers such as Gemma's norms or state
layers, a partial rotary dim, both FULL and SWA components, the kernels off, a compiled model)
keeps the eager (or compiled) path. $RADIXKV_NATIVE_STACK=0 turns it off.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, cast

import torch

from radixkv.model.attention import TorchAttention

if TYPE_CHECKING:
    from radixkv.model.attention import KVStep
    from radixkv.model.families.skeleton import DecoderLayer, DecoderLM


def _layer_ok(layer: DecoderLayer, dtype: torch.dtype) -> bool:
    """Whether the C++ stack computes this layer exactly as its eager forward does."""
    attn, mlp, spec = layer.attn, layer.mlp, layer.attn.spec
    projections = (attn.qkv, attn.o_proj, mlp.gate_up, mlp.down)
    norms = [layer.input_norm, layer.post_norm]
    if attn.q_norm is not None and attn.k_norm is not None:
        norms += [attn.q_norm, attn.k_norm]
    return (
        all(p.invariant for p in projections)
        and spec.qk_norm in (None, "rms")
        and not spec.output_gate
        and spec.rotary_dim in (None, spec.head_dim)
        and spec.head_dim % 16 == 0
        and spec.head_dim <= 256
        and mlp.act == "silu"
        and all(n.dtype == dtype and n.dim() == 1 for n in norms)
    )


def _shape(layer: DecoderLayer) -> tuple[int, int, int, float]:
    s = layer.attn.spec
    return (s.num_heads, s.num_kv_heads, s.head_dim, layer.eps)


class NativeStack:
    """`stack(x, cos, sin, ctx)` = the decoder layers applied in order, in one C++ call.
    Build with `NativeStack.of(model)` (None where it cannot serve the model); `serves(ctx)`
    says whether it can run a given forward."""

    def __init__(self, impl: Any) -> None:
        self.impl = impl

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
        if module is None or not hasattr(module, "DecoderStack") or not model.stackable:
            return None
        layers = cast("list[DecoderLayer]", list(model.layers))
        shape = _shape(layers[0])
        scales = {at.scale for at in model.attn_layers.values()}
        if len(scales) != 1 or not all(
            _layer_ok(layer, model.dtype) and _shape(layer) == shape for layer in layers
        ):
            return None
        impl = module.DecoderStack(*shape, scales.pop())
        for layer in layers:
            attn, mlp = layer.attn, layer.mlp
            projections = (attn.qkv, attn.o_proj, mlp.gate_up, mlp.down)
            impl.add_layer(
                layer.input_norm.detach(),
                layer.post_norm.detach(),
                None if attn.q_norm is None else attn.q_norm.detach(),
                None if attn.k_norm is None else attn.k_norm.detach(),
                [p.weight for p in projections],
                [p.product_outputs for p in projections],
                [p.bias_f32 for p in projections],
                mlp.gate_up.silu,
                layer.window or 0,
            )
        return cls(impl)

    def serves(self, x: torch.Tensor, cos: torch.Tensor, ctx: KVStep) -> bool:
        """Whether this forward fits (the backend was checked once, in `of`): one KV component,
        cos/sin and its pool in x's dtype on the CPU, one pool layer per decoder layer."""
        if len(ctx.pools) != 1:
            return False
        pool, _ = ctx.only()
        return (
            cos.dtype == x.dtype
            and pool.config.dtype == x.dtype
            and torch.device(pool.config.device).type == "cpu"
            and len(pool.k) == self.impl.num_layers()
        )

    def __call__(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: KVStep
    ) -> torch.Tensor:
        # The backend's fused form: the C++ loop writes K/V at the metadata's out slots and
        # makes the backend's kernel calls (TorchAttention.stack_args).
        pool, meta = ctx.only()
        backend = cast(TorchAttention, ctx.backend)
        out: torch.Tensor = self.impl.forward(
            x, cos, sin, pool.k, pool.v, *backend.stack_args(meta)
        )
        return out

"""The compiled layer stack: torch.compile (inductor, C++ codegen on CPU) of all decoder layers of
a model whose layers are the skeleton's standard, stackable `DecoderLayer` (any family).

Dynamo traces the 30-odd layers into one graph in which the two non-element-wise calls are custom
ops it does not look into: `radixkv::packed_linear` (the oneDNN-packed projections) and
`radixkv::attention` (the model's AttentionBackend `forward`: writes this step's K/V into the pool
by slot, then attends, with the per-step metadata of the KVStep set around the call).
Everything between them — residual add + RMSNorm, RoPE, SiLU * up, the casts — is fused by
inductor into a few C++ loops per layer.

Shapes: the token dimension is marked dynamic, so one graph serves every prefill length and decode
batch size >= 2; a single token (one request decoding) gets its own specialised graph. Compiled
artefacts go to inductor's on-disk cache under the RadixKV cache directory
(`$RADIXKV_CACHE_DIR/inductor`, default ~/.cache/radixkv/inductor) unless
$TORCHINDUCTOR_CACHE_DIR says otherwise, so a restart reuses them.
"""

from __future__ import annotations

import itertools
import os
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from radixkv.model.nn.linear import LIB, PackedLinear

if TYPE_CHECKING:
    from radixkv.model.attention import KVStep
    from radixkv.model.families.skeleton import DecoderLayer

# The context of the forward in progress; set only while a compiled stack runs (one engine thread
# runs the model, so one slot suffices).
_CTX: list[KVStep] = []
_STACK_IDS = itertools.count()


LIB.define("attention(Tensor q, Tensor k, Tensor v, int layer) -> Tensor")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    """Store k/v at this step's slots of `layer`, then attend q to each request's context."""
    return _CTX[-1].attend(layer, q, k, v)


def _attention_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    return torch.empty_like(q)


LIB.impl("attention", attention, "CompositeExplicitAutograd")
torch.library.register_fake("radixkv::attention", _attention_fake, lib=LIB)


class _TracedOps:
    """LayerOps as the compiler sees them: opaque custom ops."""

    def linear(self, lin: PackedLinear, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.radixkv.packed_linear(x, lin.handle)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.ops.radixkv.attention(q, k, v, layer)


_OPS = _TracedOps()


def compile_cache_dir() -> str:
    """Where inductor keeps compiled artefacts (set once, before the first compile)."""
    from radixkv.model.checkpoints.default import cache_root

    path = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(cache_root() / "inductor")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    return path


class CompiledStack:
    """`stack(x, cos, sin, ctx)` = the decoder layers applied in order, compiled on first use."""

    def __init__(self, layers: Sequence[DecoderLayer]) -> None:
        compile_cache_dir()
        self.layers = list(layers)
        self.fn = torch.compile(self._own_run(), fullgraph=True, dynamic=False)

    def _own_run(self) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        """`self._run` over a code object of this stack's own. Dynamo keeps its graphs, and its
        recompile limit (8), per code object: with `_run`'s shared one, every further model
        compiled in the process (a test session, a bench of several models) recompiled over
        the others' guards and the ninth graph failed."""
        code = CompiledStack._run.__code__
        code = code.replace(co_name=f"{code.co_name}_{next(_STACK_IDS)}")
        return types.MethodType(types.FunctionType(code, globals()), self)

    def _run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer.block(x, cos, sin, _OPS)
        return x

    def __call__(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: KVStep
    ) -> torch.Tensor:
        for t in (x, cos, sin):
            torch._dynamo.maybe_mark_dynamic(t, 0)
        _CTX.append(ctx)
        try:
            out: torch.Tensor = self.fn(x, cos, sin)
        finally:
            _CTX.pop()
        return out

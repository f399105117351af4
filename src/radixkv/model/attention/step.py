"""One forward's attention, as every family's attention layers call it.

`KVStep` is the `attend(layer, q, k, v)` half of a decoder layer's LayerOps
(radixkv.model.nn.blocks) for any model: it holds, per KV component ("full", "swa"), the pool and
the backend's metadata for this step (prepared once here, or handed in by a graph runner through
`ForwardBatch.attention`), and per attention layer where it reads and writes (`AttnLayer`).
Every call goes to the backend's `forward`, which writes the layer's new K/V and attends: the
model never writes the pool itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from radixkv.memory.hybrid import FULL, SWA, ModelPools, PoolSpec
from radixkv.memory.pool import KVPool
from radixkv.model.attention.backend import AttentionBackend
from radixkv.model.batch import ForwardBatch
from radixkv.model.nn.linear import PackedLinear


@dataclass(frozen=True)
class AttnLayer:
    """Where attention layer i of a model reads and writes: its component, its layer in that
    component's pool, its window, its score scale."""

    kind: str
    pool_layer: int
    window: int | None
    scale: float


def window_view(batch: ForwardBatch, kind: str = SWA) -> ForwardBatch:
    """The batch as windowed kind `kind`'s pool sees it: its slots in place of FULL ones. Freed
    positions (-1) become slot 0: they are outside every window of this step, so never attended,
    and a backend that gathers them anyway reads finite data it masks out."""
    own = batch.window(kind)
    if own is None:
        raise ValueError(f"this model has {kind} layers: the batch needs its {kind} slot table")
    return dataclasses.replace(
        batch, slot_table=own.slot_table.clamp(min=0), out_slots=own.out_slots
    )


def kv_components(
    batch: ForwardBatch, pools: KVPool | ModelPools, spec: PoolSpec
) -> dict[str, tuple[KVPool, ForwardBatch]]:
    """Per attention kind of a model with `spec`: its pool and its view of the batch (FULL's is
    the batch; any other kind's is its own slots, `window_view`). A bare KVPool is the legacy
    one-component call (the batch's slots are that pool's): the model's one attention kind."""
    attention = spec.attention_kinds
    if isinstance(pools, KVPool):
        return {attention[0] if len(attention) == 1 else FULL: (pools, batch)}
    out: dict[str, tuple[KVPool, ForwardBatch]] = {}
    for kind in attention:
        pool = pools.kv(kind)
        if pool is None:
            raise ValueError(f"this model has {kind} attention layers: a {kind} pool is required")
        out[kind] = (pool, batch if kind == FULL else window_view(batch, kind))
    return out


class KVStep:
    """Per-forward access to the KV components: the LayerOps of an eager forward
    (`attend(layer, q, k, v)` and `linear`), and what the compiled and native stacks read."""

    def __init__(
        self,
        backend: AttentionBackend,
        components: Mapping[str, tuple[KVPool, ForwardBatch]],
        layers: Mapping[int, AttnLayer],
        prepared: Mapping[str, Any] | None = None,
    ) -> None:
        self.backend = backend
        self.layers = layers
        self.pools = {kind: pool for kind, (pool, _) in components.items()}
        if prepared is not None and set(prepared) != set(components):
            raise ValueError(
                f"prepared attention metadata for {sorted(prepared)}, "
                f"the model's KV components are {sorted(components)}"
            )
        self.meta: dict[str, Any] = {
            kind: prepared[kind] if prepared is not None else backend.prepare(view)
            for kind, (_, view) in components.items()
        }

    def only(self) -> tuple[KVPool, Any]:
        """The pool and metadata of a one-component model."""
        (kind,) = self.pools
        return self.pools[kind], self.meta[kind]

    def linear(self, lin: PackedLinear, x: torch.Tensor) -> torch.Tensor:
        return lin(x)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Through the backend: store k/v ([T, KV, D]) of the model's layer `layer` in its
        component's pool, then attend q to every request's context."""
        at = self.layers[layer]
        pool = self.pools[at.kind]
        return self.backend.forward(
            q,
            k,
            v,
            pool.k[at.pool_layer],
            pool.v[at.pool_layer],
            self.meta[at.kind],
            at.window,
            at.scale,
        )

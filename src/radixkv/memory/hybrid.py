"""Pools of a model by kind: what each kind of layer keeps (`PoolSpec`, a layer group spec per
kind) and their tensors (`ModelPools`).

Each kind of layer keeps its own memory, described by its group spec (vLLM v1's per-layer KV
cache specs are the model):
- FULL attention layers keep K/V for every token, in a `KVPool` over only those layers
  (`KVGroupSpec`, no window);
- SWA (sliding-window) layers keep K/V too, in a second `KVPool` over only those layers, with their
  own slot numbering (a request needs only the last W tokens there; `KVGroupSpec` with a window);
- STATE layers (gated DeltaNet recurrent + conv state, LFM2 short-conv state) keep a fixed-size
  state per sequence, in a `StatePool` (`StateGroupSpec`): one slot holds the state of ALL state
  layers of one sequence at one boundary. Working states of running requests and cached
  checkpoints are slots of the same pool; copy-on-write is done by copying whole slots.
A new kind of layer is a new group spec class (`LayerGroupSpec`): `PoolSpec` sizes slots and makes
pools through it and never names a kind.

`ModelPools` is keyed by kind (`FULL`, `SWA`, `STATE`, the names every layer of the engine keys
its per-kind data by). These are tensor owners only; which slot belongs to whom is the
allocators' and the tree's business.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

import torch

from radixkv.memory.pool import KVPool, KVPoolConfig
from radixkv.memory.state_pool import StateLayerSpec, StatePool, StatePoolConfig

# The kinds of KV memory a layer can keep (vLLM v1's per-layer KV cache specs are the model):
# the keys of `ModelPools`, of a request's per-kind holdings and of the engine's per-kind memory
# registry (radixkv.engine.kv.kinds). FULL is the one every model has (zero layers when it lacks
# full attention: token bookkeeping slots).
FULL, SWA, STATE = "full", "swa", "state"


class ModelPools:
    """The pools one forward reads and writes, keyed by kind (FULL, SWA, STATE, ...); a kind the
    model lacks is absent (None values are dropped)."""

    def __init__(self, pools: Mapping[str, Any] | None = None) -> None:
        self._pools: dict[str, Any] = {k: p for k, p in (pools or {}).items() if p is not None}

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self._pools)

    def __contains__(self, kind: object) -> bool:
        return kind in self._pools

    def __getitem__(self, kind: str) -> Any:
        return self._pools[kind]

    def get(self, kind: str) -> Any | None:
        return self._pools.get(kind)

    def kv(self, kind: str) -> KVPool | None:
        """The K/V pool of an attention kind (FULL, SWA), None when absent."""
        pool = self._pools.get(kind)
        if pool is not None and not isinstance(pool, KVPool):
            raise TypeError(f"the {kind} pool is not a KVPool")
        return pool

    def state(self, kind: str = STATE) -> StatePool | None:
        """The state pool of a recurrent kind, None when absent."""
        pool = self._pools.get(kind)
        if pool is not None and not isinstance(pool, StatePool):
            raise TypeError(f"the {kind} pool is not a StatePool")
        return pool


class LayerGroupSpec(Protocol):
    """What the layers of one kind keep, as one pool (vLLM v1's per-layer KV cache specs are
    the model): how many layers, the bytes of one slot, and the pool itself. A kind's group spec
    is all `PoolSpec` knows of it, so a new kind of layer is a new class of this shape."""

    @property
    def num_layers(self) -> int: ...

    def slot_bytes(self, dtype: torch.dtype) -> int:
        """Bytes of one slot of this group's pool, every layer of the group."""

    def make_pool(self, num_slots: int, dtype: torch.dtype, device: str) -> Any:
        """This group's pool of `num_slots` slots (`dtype`: the model's)."""


@dataclass(frozen=True)
class KVGroupSpec:
    """Attention layers that keep K/V per token (FULL: every token; SWA: the last `window`)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    window: int | None = None  # None: full causal attention

    def __post_init__(self) -> None:
        if self.window is not None and self.window <= 0:
            raise ValueError(f"an attention window must be positive (got {self.window})")

    def pool_config(
        self, num_slots: int, dtype: torch.dtype = torch.float32, device: str = "cpu"
    ) -> KVPoolConfig:
        return KVPoolConfig(
            self.num_layers, self.num_kv_heads, self.head_dim, num_slots, dtype, device
        )

    def slot_bytes(self, dtype: torch.dtype) -> int:
        """A token's K and V in every layer of the group."""
        return self.pool_config(0, dtype).bytes_per_slot

    def make_pool(self, num_slots: int, dtype: torch.dtype, device: str) -> KVPool:
        return KVPool(self.pool_config(num_slots, dtype, device))


@dataclass(frozen=True)
class StateGroupSpec:
    """Recurrent layers that keep a fixed-size state per sequence: one slot holds the state of
    every layer of the group (layer j = the model's j-th state layer)."""

    layers: tuple[StateLayerSpec, ...]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def pool_config(
        self, num_slots: int, dtype: torch.dtype = torch.float32, device: str = "cpu"
    ) -> StatePoolConfig:
        return StatePoolConfig(self.layers, num_slots, dtype, device)

    def slot_bytes(self, dtype: torch.dtype) -> int:
        """A sequence's whole state, every layer of the group."""
        return self.pool_config(0, dtype).bytes_per_slot

    def make_pool(self, num_slots: int, dtype: torch.dtype, device: str) -> StatePool:
        return StatePool(self.pool_config(num_slots, dtype, device))


@dataclass(frozen=True)
class PoolSpec:
    """The kinds a model keeps memory of, each with its layer group (`groups`: kind -> spec, in
    kind order, e.g. FULL, SWA, STATE); layer j of a kind's pool is the model's j-th layer of
    that kind. Only kinds the model has layers of are here (a FULL-less model has no FULL group;
    the engine gives it zero-layer bookkeeping slots). Nothing here names a kind: a model config
    declares a new kind of layer by adding its group (`ModelConfig.layer_groups`)."""

    groups: Mapping[str, LayerGroupSpec]
    # derived once (every forward reads it): the kinds with a `KVGroupSpec`
    attention_kinds: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        groups = dict(self.groups)
        empty = [kind for kind, g in groups.items() if g.num_layers <= 0]
        if empty:
            raise ValueError(f"layer group(s) {empty} have no layers (leave the kind out)")
        object.__setattr__(self, "groups", MappingProxyType(groups))
        attention = tuple(k for k, g in groups.items() if isinstance(g, KVGroupSpec))
        object.__setattr__(self, "attention_kinds", attention)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds this model has layers of, in the groups' order (`attention_kinds`: those
        whose layers keep K/V per token, a `KVGroupSpec`)."""
        return tuple(self.groups)

    def __contains__(self, kind: object) -> bool:
        return kind in self.groups

    def __getitem__(self, kind: str) -> LayerGroupSpec:
        return self.groups[kind]

    def get(self, kind: str) -> LayerGroupSpec | None:
        return self.groups.get(kind)

    def window(self, kind: str) -> int | None:
        """The window of attention kind `kind`'s layers (None: full attention, or no such
        kind)."""
        group = self.groups.get(kind)
        return group.window if isinstance(group, KVGroupSpec) else None

    def slot_bytes(self, kind: str, dtype: torch.dtype) -> int:
        """Bytes of one slot of `kind`'s pool (a token of every layer of an attention kind, a
        sequence's whole state of a state kind); 0 for a kind the model has no layers of."""
        group = self.groups.get(kind)
        return 0 if group is None else group.slot_bytes(dtype)

    def make_pools(
        self,
        sizes: Mapping[str, int],
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
    ) -> ModelPools:
        """Allocate the pool of every kind this model has, `sizes[kind]` slots each (sizes of
        kinds it lacks are ignored; radixkv.engine.kv.kinds.pool_sizes gives the engine's)."""
        missing = [k for k in self.kinds if k not in sizes]
        if missing:
            raise ValueError(f"no pool size for kind(s) {missing}")
        return ModelPools(
            {kind: g.make_pool(sizes[kind], dtype, device) for kind, g in self.groups.items()}
        )

"""Pools of a hybrid model: which components it needs (`PoolSpec`) and their tensors (`ModelPools`).

A hybrid model has up to three kinds of layers, each with its own memory component:
- FULL attention layers keep K/V for every token, in a `KVPool` over only those layers;
- SWA (sliding-window) layers keep K/V too, in a second `KVPool` over only those layers, with their
  own slot numbering (a request needs only the last W tokens there);
- STATE layers (gated DeltaNet recurrent + conv state, LFM2 short-conv state) keep a fixed-size
  state per sequence, in a `StatePool`: one slot holds the state of ALL state layers of one
  sequence at one boundary. Working states of running requests and cached checkpoints are slots
  of the same pool; copy-on-write is done by copying whole slots (`copy_state`).

`ModelPools` is keyed by kind (`FULL`, `SWA`, `STATE`, the names every layer of the engine keys
its per-kind data by). These are tensor owners only; which slot belongs to whom is the
allocators' and the tree's business.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from radixkv.memory.pool import KVPool, KVPoolConfig


def _elem(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class StateTensorSpec:
    """One named per-slot tensor of a state layer, e.g. ("conv", (C, K-1)).

    `dtype` None means the model dtype; recurrent states pin float32 (they accumulate)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype | None = None

    def resolve(self, model_dtype: torch.dtype) -> torch.dtype:
        return model_dtype if self.dtype is None else self.dtype


@dataclass(frozen=True)
class StateLayerSpec:
    """The state tensors of one STATE layer (order = the model's state layers in order)."""

    tensors: tuple[StateTensorSpec, ...]


@dataclass(frozen=True)
class StatePoolConfig:
    layers: tuple[StateLayerSpec, ...]
    num_slots: int
    dtype: torch.dtype = torch.float32  # the model dtype (tensors with dtype None use it)
    device: str = "cpu"

    @property
    def bytes_per_slot(self) -> int:
        total = 0
        for layer in self.layers:
            for t in layer.tensors:
                n = 1
                for d in t.shape:
                    n *= d
                total += n * _elem(t.resolve(self.dtype))
        return total

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_slot * self.num_slots


class StatePool:
    """`tensors[j][name]`: [num_slots, *shape] for the j-th state layer.

    Slot contents are opaque to the pool. Invariant kept by callers: a slot is either free, a
    running request's working state (written by the model in place), or a checkpoint (never written
    again until freed)."""

    def __init__(self, config: StatePoolConfig) -> None:
        self.config = config
        self.tensors: list[dict[str, torch.Tensor]] = [
            {
                t.name: torch.zeros(
                    (config.num_slots, *t.shape),
                    dtype=t.resolve(config.dtype),
                    device=config.device,
                )
                for t in layer.tensors
            }
            for layer in config.layers
        ]

    @property
    def num_slots(self) -> int:
        return self.config.num_slots

    @property
    def num_layers(self) -> int:
        return len(self.tensors)

    def copy_state(self, src: int, dst: int) -> None:
        """Slot `dst` becomes an exact copy of slot `src` (every layer, every tensor)."""
        if src == dst:
            return
        for layer in self.tensors:
            for t in layer.values():
                t[dst].copy_(t[src])

    def copy_states(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Batched `copy_state`: dst[i] <- src[i]; `dst` must not repeat nor overlap `src`."""
        src = src.to(self.config.device)
        dst = dst.to(self.config.device)
        for layer in self.tensors:
            for t in layer.values():
                t.index_copy_(0, dst, t.index_select(0, src))

    def clear(self, slots: torch.Tensor) -> None:
        """Zero the given slots (the state before any token)."""
        slots = slots.to(self.config.device)
        for layer in self.tensors:
            for t in layer.values():
                t.index_fill_(0, slots, 0)


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


@dataclass(frozen=True)
class PoolSpec:
    """Which components a model needs, and their shapes (per slot).

    FULL pool layer j = the model's j-th full-attention layer; SWA pool layer j = its j-th sliding
    layer; state layer j = its j-th state layer. FULL and SWA share K/V heads and head_dim."""

    num_full_layers: int
    num_swa_layers: int
    swa_window: int | None
    num_kv_heads: int
    head_dim: int
    state_layers: tuple[StateLayerSpec, ...] = ()

    def __post_init__(self) -> None:
        if (self.swa_window is None) != (self.num_swa_layers == 0):
            raise ValueError("swa_window must be set iff there are SWA layers")

    @property
    def has_full(self) -> bool:
        return self.num_full_layers > 0

    @property
    def has_swa(self) -> bool:
        return self.num_swa_layers > 0

    @property
    def has_state(self) -> bool:
        return len(self.state_layers) > 0

    def _kv(self, layers: int, num_slots: int, dtype: torch.dtype, device: str) -> KVPoolConfig:
        return KVPoolConfig(layers, self.num_kv_heads, self.head_dim, num_slots, dtype, device)

    def full_pool_config(
        self, num_slots: int, dtype: torch.dtype = torch.float32, device: str = "cpu"
    ) -> KVPoolConfig | None:
        return self._kv(self.num_full_layers, num_slots, dtype, device) if self.has_full else None

    def swa_pool_config(
        self, num_slots: int, dtype: torch.dtype = torch.float32, device: str = "cpu"
    ) -> KVPoolConfig | None:
        return self._kv(self.num_swa_layers, num_slots, dtype, device) if self.has_swa else None

    def state_pool_config(
        self, num_slots: int, dtype: torch.dtype = torch.float32, device: str = "cpu"
    ) -> StatePoolConfig | None:
        if not self.has_state:
            return None
        return StatePoolConfig(self.state_layers, num_slots, dtype, device)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds this model has layers of, in the order FULL, SWA, STATE."""
        has = {FULL: self.has_full, SWA: self.has_swa, STATE: self.has_state}
        return tuple(kind for kind, yes in has.items() if yes)

    def slot_bytes(self, kind: str, dtype: torch.dtype) -> int:
        """Bytes of one slot of `kind`'s pool: a token of every layer of that kind (FULL, SWA),
        a sequence's whole state (STATE); 0 for a kind the model has no layers of."""
        if kind == STATE:
            return self.state_bytes_per_slot(dtype)
        layers = {FULL: self.num_full_layers, SWA: self.num_swa_layers}[kind]
        return 2 * self.num_kv_heads * self.head_dim * _elem(dtype) * layers

    def kv_bytes_per_token(self, dtype: torch.dtype) -> tuple[int, int]:
        """(FULL, SWA) bytes of one token slot."""
        return self.slot_bytes(FULL, dtype), self.slot_bytes(SWA, dtype)

    def state_bytes_per_slot(self, dtype: torch.dtype) -> int:
        return StatePoolConfig(self.state_layers, 0, dtype).bytes_per_slot

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
        pools: dict[str, Any] = {}
        for kind in self.kinds:
            if kind == STATE:
                pools[kind] = StatePool(
                    StatePoolConfig(self.state_layers, sizes[kind], dtype, device)
                )
            else:
                layers = self.num_full_layers if kind == FULL else self.num_swa_layers
                pools[kind] = KVPool(self._kv(layers, sizes[kind], dtype, device))
        return ModelPools(pools)

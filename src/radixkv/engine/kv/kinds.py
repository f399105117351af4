"""The registry of kinds of KV memory besides FULL: one line per kind, naming the class that keeps
a running request's part of that kind's pool (a `KindMemory`, engine/kv/kind_memory.py), how its
pool is sized (a `KindSizing`, engine/kv/kind_sizing.py), the class of its store in the
host/storage tiers (a `KindStore`, engine/tiers/kind_store.py; none for a kind the tree never
sees) and what the prefix tree keeps of it for a model (a `ComponentSpec`: the kind's
`TreeComponent` class, kept in radixkv/cache/hybrid/, and its argument, e.g. SWA's window; None:
nothing; the tree has no registry of its own). A model's `PoolSpec`
(radixkv.memory.hybrid) names the kinds it has: `pool_sizes` sizes their pools, the hybrid
coordinator (`ComponentMemory`) builds one memory per kind from this table and iterates them,
and the tiers get a store per kind that has one (`tier_stores`). A new kind is its own module(s)
plus one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from radixkv.cache.hybrid.component import ComponentSpec
from radixkv.config import EngineConfig
from radixkv.engine.kv.kind_memory import KindMemory, KindSetup
from radixkv.engine.kv.kind_sizing import KindSizing, SizeContext, split_budget
from radixkv.engine.kv.state_kv import StateMemory, StateSizing, state_component
from radixkv.engine.kv.swa_kv import SwaMemory, SwaSizing, swa_component
from radixkv.engine.tiers.kind_store import KindStore, StoreSetup
from radixkv.engine.tiers.state_store import StateStore
from radixkv.engine.tiers.swa_store import SwaStore
from radixkv.memory.hybrid import FULL, STATE, SWA, PoolSpec


@dataclass(frozen=True)
class Kind:
    """One kind's entry: its memory, its pool's sizing (None: a kind no `PoolSpec` names, whose
    pool is made by hand), its tier store (None: the tiers do not keep it) and the tree's
    component for a model's `PoolSpec` (None, or a function answering None: the tree never sees
    it)."""

    memory: Callable[[Any, KindSetup], KindMemory]
    sizing: KindSizing | None = None
    store: Callable[[Any, StoreSetup], KindStore] | None = None
    tree: Callable[[PoolSpec], ComponentSpec | None] | None = None


KINDS: dict[str, Kind] = {
    SWA: Kind(SwaMemory, SwaSizing(), SwaStore, swa_component),
    STATE: Kind(StateMemory, StateSizing(), StateStore, state_component),
}


def build_kinds(pools: dict[str, Any], setup: KindSetup) -> dict[str, KindMemory]:
    """One memory per kind of `pools` (kind -> pool, FULL left out), in the registry's order."""
    unknown = sorted(set(pools) - set(KINDS))
    if unknown:
        raise ValueError(f"no memory registered for KV kind(s) {unknown} (engine/kv/kinds.py)")
    return {kind: k.memory(pools[kind], setup) for kind, k in KINDS.items() if kind in pools}


def tree_components(spec: PoolSpec) -> list[ComponentSpec]:
    """What the prefix tree keeps besides FULL for a model of `spec`, in the registry's order."""
    parts = (k.tree(spec) for k in KINDS.values() if k.tree is not None)
    return [part for part in parts if part is not None]


def tier_stores() -> dict[str, Callable[[Any, StoreSetup], KindStore]]:
    """kind -> its tier store class, for every kind the tiers keep (`tier_setup.make_tiers`)."""
    return {kind: k.store for kind, k in KINDS.items() if k.store is not None}


def pool_sizes(cfg: EngineConfig, spec: PoolSpec, dtype: torch.dtype) -> dict[str, int]:
    """kind -> slots of its pool, for FULL (always: zero-layer bookkeeping slots when the model
    has no FULL layers) and every other kind `spec` has, each sized by its registered sizing."""
    sizings: dict[str, KindSizing] = {}
    for kind in spec.kinds:
        entry = KINDS.get(kind)
        if kind == FULL:
            continue
        if entry is None or entry.sizing is None:
            raise ValueError(f"no sizing registered for KV kind {kind!r} (engine/kv/kinds.py)")
        sizings[kind] = entry.sizing
    return split_budget(SizeContext(cfg, spec, dtype), sizings)

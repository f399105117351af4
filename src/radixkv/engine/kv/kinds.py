"""The registry of kinds of KV memory besides FULL: one line per kind, naming the class that keeps
a running request's part of that kind's pool (a `KindMemory`, engine/kv/kind_memory.py), the
class of its store in the host/storage tiers (a `KindStore`, engine/tiers/kind_store.py; none for
a kind the tree never sees) and what the prefix tree keeps of it for a model (a component name of
`radixkv.cache.Components`, e.g. "swa:4096"; None: nothing). A model's `ModelPools`
(radixkv.memory.hybrid) names the kinds it has; the hybrid coordinator (`ComponentMemory`) builds
one memory per kind from this table and iterates them, and the tiers get a store per kind that
has one (`tier_stores`). A new kind is its own module(s) plus one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from radixkv.engine.kv.kind_memory import KindMemory, KindSetup
from radixkv.engine.kv.state_kv import StateMemory, state_component
from radixkv.engine.kv.swa_kv import SwaMemory, swa_component
from radixkv.engine.tiers.kind_store import KindStore, StoreSetup
from radixkv.engine.tiers.state_store import StateStore
from radixkv.engine.tiers.swa_store import SwaStore
from radixkv.memory.hybrid import STATE, SWA, PoolSpec


@dataclass(frozen=True)
class Kind:
    """One kind's entry: its memory, its tier store (None: the tiers do not keep it) and the
    tree's component for a model's `PoolSpec` (None, or a function answering None: the tree
    never sees it)."""

    memory: Callable[[Any, KindSetup], KindMemory]
    store: Callable[[Any, StoreSetup], KindStore] | None = None
    tree: Callable[[PoolSpec], str | None] | None = None


KINDS: dict[str, Kind] = {
    SWA: Kind(SwaMemory, SwaStore, swa_component),
    STATE: Kind(StateMemory, StateStore, state_component),
}


def build_kinds(pools: dict[str, Any], setup: KindSetup) -> dict[str, KindMemory]:
    """One memory per kind of `pools` (kind -> pool, FULL left out), in the registry's order."""
    unknown = sorted(set(pools) - set(KINDS))
    if unknown:
        raise ValueError(f"no memory registered for KV kind(s) {unknown} (engine/kv/kinds.py)")
    return {kind: k.memory(pools[kind], setup) for kind, k in KINDS.items() if kind in pools}


def tree_components(spec: PoolSpec) -> list[str]:
    """What the prefix tree keeps besides FULL for a model of `spec`, in the registry's order."""
    names = (k.tree(spec) for k in KINDS.values() if k.tree is not None)
    return [name for name in names if name is not None]


def tier_stores() -> dict[str, Callable[[Any, StoreSetup], KindStore]]:
    """kind -> its tier store class, for every kind the tiers keep (`tier_setup.make_tiers`)."""
    return {kind: k.store for kind, k in KINDS.items() if k.store is not None}

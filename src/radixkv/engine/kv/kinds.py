"""The registry of kinds of KV memory besides FULL: kind name -> the class that keeps a running
request's part of that kind's pool (a `KindMemory`, engine/kv/kind_memory.py), built from the
kind's pool and a `KindSetup`. A model's `ModelPools` (radixkv.memory.hybrid) names the kinds it
has; the hybrid coordinator (`ComponentMemory`) builds one memory per kind from this table and
iterates them. A new kind is its own module plus one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixkv.engine.kv.kind_memory import KindMemory, KindSetup
from radixkv.engine.kv.state_kv import StateMemory
from radixkv.engine.kv.swa_kv import SwaMemory
from radixkv.memory.hybrid import STATE, SWA

KINDS: dict[str, Callable[[Any, KindSetup], KindMemory]] = {
    SWA: SwaMemory,
    STATE: StateMemory,
}


def build_kinds(pools: dict[str, Any], setup: KindSetup) -> dict[str, KindMemory]:
    """One memory per kind of `pools` (kind -> pool, FULL left out), in the registry's order."""
    unknown = sorted(set(pools) - set(KINDS))
    if unknown:
        raise ValueError(f"no memory registered for KV kind(s) {unknown} (engine/kv/kinds.py)")
    return {kind: make(pools[kind], setup) for kind, make in KINDS.items() if kind in pools}

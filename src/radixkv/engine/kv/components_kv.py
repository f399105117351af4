"""Memory of a hybrid model's kinds besides FULL (SWA KV, STATE, ...) for running requests: the
KV manager's partner, and the coordinator of one `KindMemory` per kind (engine/kv/kinds.py).

It holds the hybrid tree (`radixkv.cache.HybridCache`, through its `HybridPrefixCache`
contract) and makes every call that moves data in or out of it, returning what the tree lets go
of to FULL's allocator (the KV manager's) and to each kind's (`take_freed`). Everything a
running request holds besides FULL is kept by its kind's memory, in `req.kv_kinds[kind]`; this
class only iterates the kinds, in the registry's order, and never names one: the tree takes and
answers each kind's data in mappings keyed by kind, which each kind reads its own entry of. Tier
loads (engine/kv/tier_load.py) go through the kinds the tiers keep (`TierKind`, `tier_kind`).

Census per kind after every public call (`check`): free + cached in the tree + held by running
requests == that kind's pool (engine/kv/swa_kv.py, engine/kv/state_kv.py say what each holds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from radixkv.cache.base import SlotArray
from radixkv.cache.hybrid.components import (
    Components,
    Freed,
    HybridInsert,
    HybridMatch,
    HybridPrefixCache,
)
from radixkv.engine.kv.kind_memory import KindMemory, KindSetup, TierKind
from radixkv.engine.kv.kinds import build_kinds, tree_components
from radixkv.engine.request import Request
from radixkv.engine.tiers.kind_store import KindPart
from radixkv.memory.allocator import PageAllocator
from radixkv.memory.hybrid import FULL, ModelPools, PoolSpec

if TYPE_CHECKING:
    from radixkv.engine.kv.kv_manager import KVManager


class ComponentMemory:
    """Every non-FULL kind's pages and slots of running requests (see the module docstring)."""

    def __init__(
        self,
        spec: PoolSpec,
        pools: ModelPools,
        full_alloc: PageAllocator,
        page_size: int,
        rows: int,
        max_context: int,
        device: str,
        cache: HybridPrefixCache | None,
        interval: int,
    ) -> None:
        self.spec = spec
        self.pools = pools
        self.page_size = page_size
        self.cache = cache  # the hybrid tree with matching Components, or None (cache off)
        self.full_alloc = full_alloc  # the KV manager's FULL allocator (FULL slots it frees)
        # The host/storage tiers (set by KVManager; NoTiers or a TierManager): told what the
        # tree adopts of every kind (`on_kinds_insert`), which FULL slots it frees (`on_evict`).
        self.tiers: Any = None
        setup = KindSetup(
            spec=spec,
            page_size=page_size,
            rows=rows,
            max_context=max_context,
            device=device,
            interval=-(-interval // page_size) * page_size,
            cache=cache,
            evict=self._evict,
        )
        others = {k: pools[k] for k in pools.kinds if k != FULL}
        self.kinds: dict[str, KindMemory] = build_kinds(others, setup)
        self._all = tuple(self.kinds.values())
        if cache is not None:
            tree = set(cache.components.kinds)
            if not tree <= set(self.kinds):
                raise ValueError(
                    f"the tree keeps kinds {sorted(tree)}, the pools {sorted(self.kinds)}"
                )
        # The kinds a tier load can bring back (each with a store in the tiers, or none to bring).
        self._tier = {kind: k for kind, k in self.kinds.items() if isinstance(k, TierKind)}

    @staticmethod
    def components_of(spec: PoolSpec) -> Components:
        """The tree's components: FULL always (real slots, or zero-layer bookkeeping slots for
        a model without FULL layers, see engine.setup.hybrid_spec), then each kind the tree
        keeps for `spec` (the registry's `tree`, engine/kv/kinds.py)."""
        return Components(full=True, parts=tuple(tree_components(spec)))

    # -- eviction --------------------------------------------------------------------------------
    def _free(self, freed: Freed) -> None:
        """Return what the tree let go of to every kind's allocator (an eviction asked for one
        kind's room may remove whole leaves, FULL slots included)."""
        if len(freed.full):
            if self.tiers is not None:
                self.tiers.on_evict(freed.full)  # write_back demotes before the slots are freed
            self.full_alloc.free_slots_of_pages(freed.full)
        for kind, m in self.kinds.items():
            m.take_freed(freed.kinds.get(kind))

    def _evict(self, kind: str, n: int) -> None:
        """`kind` is short of `n` units: ask the tree for room."""
        if self.cache is not None:
            self._free(self.cache.evict({kind: n}))

    def evict_full(self, num_tokens: int) -> None:
        """FULL pages are short: evict leaves (freeing every kind they hold)."""
        self._evict(FULL, num_tokens)

    def flush(self, idle: bool) -> None:
        """Drop every unlocked cached prefix in every kind (everything when idle)."""
        if self.cache is None:
            return
        if idle:
            self._free(self.cache.reset())
            return
        everything = 1 << 62
        self._free(self.cache.evict(dict.fromkeys([FULL, *self.kinds], everything)))

    # -- admission ----------------------------------------------------------------------------
    def match(self, req: Request, query: Any, record: bool = True) -> HybridMatch:
        """The tree's match for `req` (cache on); each kind remembers what it needs at `bind`
        (`record=False`: no hit statistics)."""
        assert self.cache is not None
        m = self.cache.match(query, req.namespace, record=record)
        for k in self._all:
            k.on_match(req, m)
        return m

    def forget_match(self, req: Request) -> None:
        for k in self._all:
            k.forget_match(req)

    def reserve(self, req: Request) -> bool:
        """What every kind takes before binding; False (nothing kept) when one is short."""
        for i, k in enumerate(self._all):
            if not k.reserve(req):
                for taken in self._all[:i]:
                    taken.unreserve(req)
                return False
        return True

    def bind(self, req: Request, prefix_len: int) -> None:
        for k in self._all:
            k.bind(req, prefix_len)

    # -- forks (n > 1): each kind copies the parent's own data (copy-on-write) ----------------
    def reserve_fork(self, parent: Request) -> dict[str, Any] | None:
        """What a fork of `parent` needs of every kind, taken first so that a later failure
        gives it back (`unreserve_fork`); None (nothing taken) when a kind is short."""
        held: dict[str, Any] = {}
        for kind, k in self.kinds.items():
            got = k.reserve_fork(parent)
            if got is None:
                self.unreserve_fork(held)
                return None
            held[kind] = got
        return held

    def unreserve_fork(self, held: dict[str, Any]) -> None:
        for kind, got in held.items():
            self.kinds[kind].unreserve_fork(got)

    def bind_fork(self, parent: Request, child: Request, held: dict[str, Any]) -> None:
        for kind, got in held.items():
            self.kinds[kind].bind_fork(parent, child, got)

    # -- stepping -----------------------------------------------------------------------------
    def ensure(self, req: Request, end: int) -> bool:
        """Every kind's room for positions < end; False when one is short (what the others
        took stays with the request, released with it)."""
        return all(k.ensure(req, end) for k in self._all)

    def chunk_cap(self, req: Request) -> int:
        """The longest next prefill chunk every kind allows."""
        caps = [c for c in (k.chunk_cap(req) for k in self._all) if c is not None]
        return min(caps) if caps else req.pending

    def after_step(self, req: Request, was_prefill: bool) -> None:
        for k in self._all:
            k.after_step(req, was_prefill)

    def batch_slots(self, reqs: Sequence[Request], rows: list[int], ends: list[int]) -> dict:
        """Every kind's slots in the step's ForwardBatch, keyed by kind (`from_table`'s
        `kind_slots`); kinds with nothing for the batch are left out."""
        out: dict[str, Any] = {}
        for k in self._all:
            got = k.batch_slots(reqs, rows, ends)
            if got is not None:
                out[k.kind] = got
        return out

    # -- handing data to the tree --------------------------------------------------------------
    def insert(
        self, req: Request, slots: SlotArray, aligned: int, finishing: bool
    ) -> tuple[int, Any]:
        """Hand tokens[:aligned] of every kind to the tree (FULL `slots`, each kind's part);
        each kind frees what it refused. Returns (already cached, handle)."""
        parts = {kind: k.tree_part(req, aligned, finishing) for kind, k in self.kinds.items()}
        out = self._tree_insert(req, aligned, slots, parts, req.prefix_len)
        if self.tiers is not None:
            kept = {kind: k.tier_part(parts[kind], out) for kind, k in self._tier.items()}
            self.tiers.on_kinds_insert(req, kept, out.cached, aligned)
        for kind, k in self.kinds.items():
            k.after_insert(req, parts[kind], out, aligned)
        return out.cached, out.handle

    def _tree_insert(
        self, req: Request, end: int, full: SlotArray, parts: Mapping[str, Any], owned_from: int
    ) -> HybridInsert:
        """The tree's insert of req.tokens[:end]: FULL slots and each kind's part (a kind the
        tree never sees has none)."""
        assert self.cache is not None
        given = {kind: part for kind, part in parts.items() if part is not None}
        return self.cache.insert(
            req.tokens[:end], full, given, req.namespace, req.options.priority, owned_from
        )

    def rewrite_prefix(self, req: Request, handle: Any) -> None:
        """After moving the lock to `handle`: every kind reads the tree's data of it."""
        for k in self._all:
            k.rewrite_prefix(req, handle)

    def release(self, req: Request) -> None:
        """Free everything the request still owns in every kind."""
        for k in self._all:
            k.release(req)

    # -- tier loads (engine/kv/tier_load.py) ---------------------------------------------------
    def peek_full(self, req: Request, length: int) -> tuple[int, np.ndarray, Any]:
        """(tokens of FULL K/V the tree holds on req's path, past the voted match of `length`
        when a kind's vote stopped it short; their slots; a guard locking them, or None)."""
        assert self.cache is not None
        shared, tree_full, guard = self.cache.peek_full(
            req.tokens[: len(req.tokens) - 1], req.namespace
        )
        if shared <= length:
            return length, tree_full, None
        self.cache.lock(guard)
        return shared, tree_full, guard

    def end_peek(self, guard: Any) -> None:
        if guard is not None and self.cache is not None:
            self.cache.unlock(guard)

    def tier_kind(self, kind: str) -> TierKind:
        return self._tier[kind]

    def insert_loaded(
        self,
        req: Request,
        boundary: int,
        full: np.ndarray,
        parts: Mapping[str, KindPart],
        units: Mapping[str, list[int]],
        length: int,
    ) -> tuple[int, Any]:
        """Hand the loaded tokens[:boundary] to the tree: FULL slots `full`, each kind's loaded
        values (none where the plan has no part); what it refuses goes back to each kind. The
        tree frees nothing of [0, length): it is locked. Returns (cached, handle)."""
        tree_parts = {}
        for kind, tk in self._tier.items():
            part = parts.get(kind)
            pages, got = (part.pages, units[kind]) if part is not None else ([], [])
            tree_parts[kind] = tk.loaded_part(pages, got, boundary)
        out = self._tree_insert(req, boundary, full, tree_parts, length)
        for kind, k in self.kinds.items():
            k.take_freed(out.refused.get(kind))
        return out.cached, out.handle

    def resume_loaded(
        self, kv: KVManager, req: Request, handle: Any, boundary: int, full: np.ndarray
    ) -> tuple[int, np.ndarray]:
        """Resume where the tree's kinds vote now (a peek: the first match counted the hit),
        with req's lock moved onto that prefix."""
        assert self.cache is not None
        old = req.handle
        m = self.match(req, req.tokens[: len(req.tokens) - 1], record=False)
        if m.length > 0:
            self.cache.lock(m.handle)
        req.handle = m.handle if m.length > 0 else None
        if old is not None:
            self.cache.unlock(old)
        return m.length, np.asarray(m.slots[: m.length], dtype=np.int64)

    # -- census ---------------------------------------------------------------------------------
    def census(self, running: Sequence[Request]) -> dict[str, dict[str, int]]:
        return {kind: k.census(running) for kind, k in self.kinds.items()}

    def check(self, running: Sequence[Request]) -> None:
        for kind, k in self.kinds.items():
            row = k.census(running)
            if row["free"] + row["cached"] + row["held"] != row["size"]:
                raise RuntimeError(f"{kind} census broken: {row}")
            k.check(running)

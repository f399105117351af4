"""Carrying out a hybrid model's tier load plan (`HybridTierManager.plan_load`): the KV manager's
side of the hybrid L2 -> L1 path, kept out of kv_manager.py.

After the tree's match (locked at `length` tokens), the tiers name the deepest boundary B every
component can resume from with what L2 holds; this allocates device memory of every component
(FULL pages for [length, B), SWA pages for the window before B, a state slot for the checkpoint
at B), lets the tiers copy the values down, inserts them into the tree (which frees what it
already had: duplicates), and matches again so that the request resumes exactly where the
tree's components now vote, with the lock moved onto that prefix. Every device slot is moved
here or by the allocators' owners; the tiers never touch one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from radixkv.cache.hybrid.components import Freed
from radixkv.engine.kv.state_kv import StateMemory
from radixkv.engine.kv.swa_kv import SwaMemory
from radixkv.engine.request import Request
from radixkv.engine.tiers.hybrid_tiers import HybridLoadPlan, HybridTierManager
from radixkv.memory.hybrid import STATE, SWA

if TYPE_CHECKING:
    from radixkv.engine.kv.components_kv import ComponentMemory
    from radixkv.engine.kv.kv_manager import KVManager


def load_components(
    kv: KVManager, comp: ComponentMemory, req: Request, length: int, slots: np.ndarray
) -> tuple[int, np.ndarray]:
    """Extend req's locked match of `length` tokens from L2; the new (length, FULL slots).
    `comp` is the KV manager's tree-side memory (`kv.comp`)."""
    tiers = kv.tiers
    if not isinstance(tiers, HybridTierManager):
        return length, slots
    if comp.cache is None:
        return length, slots
    query = req.tokens[: len(req.tokens) - 1]
    # The tree may hold FULL K/V past the voted match (a window or a checkpoint is missing
    # there); the tiers need supply only the missing components for that part. `guard` keeps
    # it from being evicted by the allocations below.
    shared, tree_full, guard = comp.cache.peek_full(query, req.namespace)
    guard = guard if shared > length else None
    comp.cache.lock(guard)
    try:
        l1_full = shared if guard is not None else length
        return _load(kv, comp, tiers, req, length, slots, l1_full, tree_full)
    finally:
        comp.cache.unlock(guard)


def _load(
    kv: KVManager,
    comp: ComponentMemory,
    tiers: HybridTierManager,
    req: Request,
    length: int,
    slots: np.ndarray,
    l1_full: int,
    tree_full: np.ndarray,
) -> tuple[int, np.ndarray]:
    """`load_components` once the tree's FULL K/V up to `l1_full` tokens (`tree_full`) is
    protected from eviction."""
    assert comp.cache is not None
    plan = tiers.plan_load(req, length, l1_full)
    if plan is None:
        return length, slots
    got = _alloc(kv, comp, plan)
    if got is None:
        tiers.load_components(plan, None)  # ends the plan's reservation, copies nothing
        return length, slots
    full_pages, swa_pages, state_slot = got
    tiers.load_components(plan, full_pages, swa_pages, state_slot)
    ps, b = kv.page_size, plan.boundary
    own = kv.allocator.page_slots(full_pages)
    tree = slots[:length] if plan.full_from == length else tree_full[: plan.full_from]
    full = np.concatenate([np.asarray(tree, dtype=np.int64), own])
    swa_mem, state_mem = _swa(comp), _state(comp)
    swa_row = None
    if swa_mem is not None:
        swa_row = np.full(b, -1, dtype=np.int64)
        for (p, _), dev in zip(plan.swa, swa_pages or [], strict=True):
            swa_row[p * ps : (p + 1) * ps] = swa_mem.page_slots([dev])
    ckpts = [(b, state_slot)] if state_slot >= 0 else []
    out = comp.cache.insert(
        req.tokens[:b], full, swa_row, ckpts, req.namespace, req.options.priority, length
    )
    # FULL pages of [full_from, cached) duplicate what the tree had; it adopted [cached, b).
    dup = max(0, out.cached - plan.full_from) // ps
    if dup:
        kv.allocator.free_page_ids(full_pages[:dup])
    # What the tree refused of the loaded SWA pages and checkpoint goes back (Freed's shape).
    refused = Freed(swa=out.swa_free, checkpoints=out.checkpoints_rejected)
    for mem in (swa_mem, state_mem):
        if mem is not None:
            mem.take_freed(refused)
    tiers.on_insert(req, full, out.cached, b)
    # Resume where the tree's components vote now (a peek: the first match counted the hit).
    old = req.handle
    m = comp.match(req, req.tokens[: len(req.tokens) - 1], record=False)
    if m.length > 0:
        comp.cache.lock(m.handle)
    req.handle = m.handle if m.length > 0 else None
    if old is not None:
        comp.cache.unlock(old)
    return m.length, np.asarray(m.slots[: m.length], dtype=np.int64)


def _alloc(
    kv: KVManager, comp: ComponentMemory, plan: HybridLoadPlan
) -> tuple[list[int], list[int], int] | None:
    """Device memory of every component for `plan`, or None (nothing kept) when short."""
    full = kv.alloc(len(plan.host_pages))
    if full is None:
        return None
    swa: list[int] = []
    swa_mem, state_mem = _swa(comp), _state(comp)
    if plan.swa:
        assert swa_mem is not None
        got = swa_mem.alloc(len(plan.swa))
        if got is None:
            kv.allocator.free_page_ids(full)
            return None
        swa = got
    state = -1
    if plan.state >= 0:
        assert state_mem is not None
        slot = state_mem.alloc_slot()
        if slot is None:
            kv.allocator.free_page_ids(full)
            if swa:
                assert swa_mem is not None
                swa_mem.free_pages(swa)
            return None
        state = slot
    return full, swa, state


def _swa(comp: ComponentMemory) -> SwaMemory | None:
    mem = comp.kinds.get(SWA)
    assert mem is None or isinstance(mem, SwaMemory)
    return mem


def _state(comp: ComponentMemory) -> StateMemory | None:
    mem = comp.kinds.get(STATE)
    assert mem is None or isinstance(mem, StateMemory)
    return mem

"""Carrying out a tier load plan (`TierManager.plan_load`): the KV manager's side of the L2 -> L1
path, one for every model and every kind of KV.

After the tree's match (locked at `length` tokens), the tiers name the deepest boundary B that
FULL pages and every other kind can resume from with what L1 and L2 hold; this allocates device
memory of every kind the plan carries (FULL pages for [full_from, B), each kind's values through
its memory, `TierKind`), lets the tiers copy the values down, hands them to the tree through the
tree-side memory (`PlainMemory` for the FULL-only `RadixCache`, `ComponentMemory` for the hybrid
tree, which frees what the tree already had) and moves the request's lock onto what the tree now
resumes at. Every device slot is moved here or by the kinds' memories; the tiers never touch one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from radixkv.engine.request import Request
from radixkv.engine.tiers.manager import LoadPlan

if TYPE_CHECKING:
    from radixkv.engine.kv.components_kv import ComponentMemory
    from radixkv.engine.kv.kv_manager import KVManager
    from radixkv.engine.kv.plain_memory import PlainMemory


def load_from_tiers(
    kv: KVManager, mem: PlainMemory | ComponentMemory, req: Request, length: int, slots: np.ndarray
) -> tuple[int, np.ndarray]:
    """Extend req's locked match of `length` tokens (`slots`) from L2; the new (length, FULL
    slots). `mem` is the KV manager's tree-side memory (`kv.comp`)."""
    if mem.cache is None:
        return length, slots
    # The tree may hold FULL K/V past the match (a kind's vote stopped it short); the tiers need
    # supply only the other kinds there. `guard` keeps it from being evicted meanwhile.
    l1_full, tree_full, guard = mem.peek_full(req, length)
    try:
        plan = kv.tiers.plan_load(req, length, l1_full)
        if plan is None:
            return length, slots
        tree = slots[:length] if plan.full_from == length else tree_full[: plan.full_from]
        got = _load(kv, mem, req, plan, length, np.asarray(tree, dtype=np.int64))
        return got if got is not None else (length, slots)
    finally:
        if guard is not None:
            mem.end_peek(guard)


def _load(
    kv: KVManager,
    mem: PlainMemory | ComponentMemory,
    req: Request,
    plan: LoadPlan,
    length: int,
    tree: np.ndarray,
) -> tuple[int, np.ndarray] | None:
    """Carry `plan` out (None: no device memory for it); `tree`: the tree's FULL slots of
    [0, plan.full_from)."""
    got = None
    try:
        got = _alloc(kv, mem, plan)
    finally:  # ends the plan's reservation, copied or not
        kv.tiers.load(plan, *(got if got is not None else (None, None)))
    if got is None:
        return None
    full_pages, units = got
    b = plan.boundary
    full = np.concatenate([tree, kv.allocator.page_slots(full_pages)])
    cached, handle = mem.insert_loaded(req, b, full, plan.parts, units, length)
    # FULL pages of [full_from, cached) duplicate what the tree had; it adopted [cached, b).
    dup = max(0, cached - plan.full_from) // kv.page_size
    if dup:
        kv.allocator.free_page_ids(full_pages[:dup])
    kv.tiers.on_insert(req, full, cached, b)
    if cached < b:  # KV events hook: the tree adopted [cached, b)
        kv.events.stored(req.tokens, full, cached, b, req.namespace, length)
    return mem.resume_loaded(kv, req, handle, b, full)


def _alloc(
    kv: KVManager, mem: PlainMemory | ComponentMemory, plan: LoadPlan
) -> tuple[list[int], dict[str, list[int]]] | None:
    """Device memory of every kind for `plan` (FULL pages, then each kind's values through its
    memory), or None (nothing kept) when one is short."""
    full = kv.alloc(len(plan.host_pages))
    if full is None:
        return None
    units: dict[str, list[int]] = {}
    for kind, part in plan.parts.items():
        got = mem.tier_kind(kind).load_alloc(len(part.host))
        if got is None:
            kv.allocator.free_page_ids(full)
            for k, taken in units.items():
                mem.tier_kind(k).load_free(taken)
            return None
        units[kind] = got
    return full, units

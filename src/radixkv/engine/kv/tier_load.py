"""Carrying out a FULL-only model's tier load plan (`TierManager.plan_load`): the KV manager's
side of the L2 -> L1 path (`hybrid_load.py` is the hybrid model's, where every component votes).

After the tree's match (locked at `length` tokens), the tiers name the host pages that continue
it; this allocates device pages for them, lets the tiers copy them down, inserts them into the
tree and moves the request's lock onto the longer prefix. Every device slot is moved here or by
the allocator; the tiers never touch one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from radixkv.cache.base import PrefixCache
from radixkv.engine.request import Request

if TYPE_CHECKING:
    from radixkv.engine.kv.kv_manager import KVManager


def load_pages(
    kv: KVManager, cache: PrefixCache, req: Request, length: int, slots: np.ndarray
) -> tuple[int, np.ndarray]:
    """Extend req's locked match of `length` tokens (`slots`) in `cache`, the FULL-only tree,
    from L2; the new (length, slots)."""
    plan = kv.tiers.plan_load(req, length)
    if plan is None:
        return length, slots
    dev_pages = None
    try:
        dev_pages = kv.alloc(len(plan.host_pages))
    finally:
        kv.tiers.load(plan, dev_pages)  # ends the plan's reservation, copied or not
    if dev_pages is None:
        return length, slots
    new_len = length + len(dev_pages) * kv.page_size
    full = np.concatenate([slots, kv.allocator.page_slots(dev_pages)])
    cached, handle = cache.insert(
        req.tokens[:new_len], full, req.namespace, priority=req.options.priority
    )
    if cached != length:  # single-threaded: the locked prefix is exactly what was there
        raise RuntimeError(f"tier load: tree had {cached} tokens, expected {length}")
    kv.tiers.on_insert(req, full, cached, new_len)
    kv.events.stored(req.tokens, full, length, new_len, req.namespace, length)  # KV events
    # The tree adopted every slot of `full` ([0, length) were its own already).
    cache.lock(handle)
    kv.unlock(req)
    req.handle = handle
    return new_len, full

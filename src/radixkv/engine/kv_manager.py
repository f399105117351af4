"""Memory bookkeeping for running requests: the only code that moves slots between the three owners
(allocator free list, prefix cache, running requests) and writes the request→token table.

Census invariant, after every public call:
    allocator.free_slots + cache.total_size + sum(len(r.own_pages) for r running) * page_size
        == allocator.num_slots
Each page has exactly one owner. A running request's positions [0, prefix_len) are cache-owned
(locked through `handle`), [prefix_len, capacity) are its `own_pages`.

Hybrid models (SWA / STATE components) add `comp` (engine/components_kv.py), which owns those
pools' bookkeeping; the cache is then a RadixCache with the same components, and every call
that moves data in or out of the tree goes through its *_components methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from radixkv.cache.base import PrefixCache
from radixkv.engine.components_kv import ComponentMemory
from radixkv.engine.kv_events import NULL_SINK, EventSink
from radixkv.engine.request import Request
from radixkv.memory.allocator import PageAllocator
from radixkv.memory.req_table import ReqToTokenTable

if TYPE_CHECKING:
    from radixkv.engine.tiers import TierManager


class KVManager:
    def __init__(
        self,
        allocator: PageAllocator,
        table: ReqToTokenTable,
        cache: PrefixCache | None,
        comp: ComponentMemory | None = None,
    ) -> None:
        self.allocator = allocator
        self.table = table
        self.cache = cache
        self.page_size = allocator.page_size
        self.comp = comp
        if comp is not None:
            comp.full_alloc = allocator
        self._swa_prefix: dict[int, Any] = {}  # id(req) -> matched SWA slots, until bind
        # Host/storage tiers (engine/tiers.py); hooks: on_insert, on_evict, on_l1_hit, extend.
        self.tiers: TierManager | None = None
        # KV events (engine/kv_events.py); hooks: every `self.events.` call below.
        self.events: EventSink = NULL_SINK

    # -- allocation ---------------------------------------------------------------------------
    def available_pages(self) -> int:
        """Pages obtainable now: free ones plus those the cache could evict."""
        evictable = self.cache.evictable_size // self.page_size if self.cache is not None else 0
        return self.allocator.free_pages + evictable

    def alloc(self, num_pages: int) -> list[int] | None:
        """`num_pages` pages, evicting unlocked cached prefixes when short; None if impossible."""
        pages = self.allocator.alloc_pages(num_pages)
        if pages is None and self.cache is not None:
            short = num_pages - self.allocator.free_pages
            if self.comp is not None:
                self._evict_full(short * self.page_size)
            else:
                evicted = self.cache.evict(short * self.page_size)
                if self.tiers is not None:  # write_back demotes before the slots are freed
                    self.tiers.on_evict(evicted)
                self.events.removed(evicted)  # KV events hook
                self.allocator.free_slots_of_pages(evicted)
            pages = self.allocator.alloc_pages(num_pages)
        return pages

    def _evict_full(self, num_tokens: int) -> None:
        assert self.cache is not None
        if self.comp is None:
            evicted = self.cache.evict(num_tokens)
            self.events.removed(evicted)  # KV events hook
            self.allocator.free_slots_of_pages(evicted)
            return
        self.comp._free(self.cache.evict_components(full_tokens=num_tokens))  # type: ignore[attr-defined]

    @staticmethod
    def capacity(req: Request, page_size: int) -> int:
        return req.prefix_len + len(req.own_pages) * page_size

    # -- admission ----------------------------------------------------------------------------
    def match_and_lock(self, req: Request) -> tuple[int, np.ndarray]:
        """Lock the longest cached prefix of all but the last token; (length, slots)."""
        if self.cache is None:
            return 0, np.empty(0, dtype=np.int64)
        query = req.tokens[: len(req.tokens) - 1]
        m = self.cache.match(query, req.namespace)
        if m.length > 0:
            self.cache.lock(m.handle)
            req.handle = m.handle
        if self.comp is not None:
            self.comp.on_match(req, m)
            self._swa_prefix[id(req)] = m.swa_slots
        slots = np.asarray(m.slots[: m.length], dtype=np.int64)
        if self.tiers is None:
            return m.length, slots
        self.tiers.on_l1_hit(slots)
        length, slots = self.tiers.extend(self, req, m.length, slots)
        if length > m.length:  # KV events hook: pages loaded from L2 joined the tree
            self.events.stored(req.tokens, slots, m.length, length, req.namespace, length)
        return length, slots

    def reserve_components(self, req: Request) -> bool:
        """Hybrid: take what a request needs besides FULL pages before it is bound."""
        return self.comp is None or self.comp.reserve(req)

    def unlock(self, req: Request) -> None:
        if req.handle is not None and self.cache is not None:
            self.cache.unlock(req.handle)
        req.handle = None
        self._swa_prefix.pop(id(req), None)

    def bind(
        self, req: Request, prefix_len: int, prefix_slots: np.ndarray, pages: list[int]
    ) -> None:
        """Give `req` a table row: cached prefix slots, then its own pages."""
        row = self.table.alloc_row()
        self.table.write(row, 0, prefix_slots)
        self.table.write(row, prefix_len, self.allocator.page_slots(pages))
        req.row, req.prefix_len, req.kv_len, req.own_pages = row, prefix_len, prefix_len, pages
        if self.comp is not None:
            self.comp.bind(req, prefix_len, self._swa_prefix.pop(id(req), None))

    def grow(self, req: Request, new_len: int) -> bool:
        """Make sure positions < new_len have slots; False (nothing changed) if out of memory."""
        cap = self.capacity(req, self.page_size)
        if new_len <= cap and self.comp is None:
            return True
        if new_len > cap:
            pages = self.alloc(self.allocator.pages_for(new_len - cap))
            if pages is None:
                return False
            self.table.write(req.row, cap, self.allocator.page_slots(pages))
            req.own_pages.extend(pages)
        return self.comp is None or self.comp.ensure(req, new_len)

    def prepare_chunk(self, req: Request, n: int) -> bool:
        """Hybrid: the SWA slots of the next `n` tokens (FULL pages come at admission)."""
        return self.comp is None or self.comp.ensure(req, req.kv_len + n)

    def chunk_cap(self, req: Request) -> int:
        """Hybrid STATE: the longest prefill chunk that stops on the next checkpoint boundary."""
        return req.pending if self.comp is None else self.comp.chunk_cap(req)

    def after_step(self, req: Request, was_prefill: bool) -> None:
        if self.comp is not None:
            self.comp.after_step(req, was_prefill)

    def fork(self, parent: Request, child: Request) -> tuple[np.ndarray, np.ndarray] | None:
        """Give `child` the parent's computed context [0, parent.kv_len) without recomputing it.

        The cache-owned prefix [0, prefix_len) is shared: the child locks the parent's handle
        again (reference counted) and reads the same slots. The parent's own computed positions
        [prefix_len, kv_len) (the partial tail page; everything when the cache is off) get fresh
        pages of the child's own. Returns (src, dst) slots whose K/V the caller copies, or None
        (nothing changed) when no row or pages are free.
        """
        if self.table.free_rows == 0 or self.comp is not None:
            # Hybrid: a fork would also need its own SWA pages and a copy of the working state;
            # the child is admitted like any request instead (it hits the parent's prefix).
            return None
        ps = self.page_size
        pre, kv_len = parent.prefix_len, parent.kv_len
        pages = self.alloc(self.allocator.pages_for(kv_len + 1) - pre // ps)
        if pages is None:
            return None
        if parent.handle is not None and self.cache is not None:
            self.cache.lock(parent.handle)
        row = self.table.alloc_row()
        self.table.write(row, 0, self.table.get_numpy(parent.row, 0, pre))
        self.table.write(row, pre, self.allocator.page_slots(pages))
        child.row, child.prefix_len, child.kv_len = row, pre, kv_len
        child.handle, child.own_pages = parent.handle, pages
        return (
            self.table.get_numpy(parent.row, pre, kv_len),
            self.table.get_numpy(row, pre, kv_len),
        )

    # -- handing computed KV to the cache -----------------------------------------------------
    def _insert(self, req: Request, aligned: int, finishing: bool = False) -> int:
        """Insert tokens[:aligned] with their slots; free our duplicate pages; return how many
        leading pages of `own_pages` the cache now owns or were freed (the tree adopted them)."""
        assert self.cache is not None
        slots = self.table.get_numpy(req.row, 0, aligned)
        if self.comp is None:
            cached = self.cache.insert(
                req.tokens[:aligned], slots, req.namespace, priority=req.options.priority
            )
        else:
            out = self.cache.insert_components(  # type: ignore[attr-defined]
                req.tokens[:aligned],
                slots,
                self.comp.swa_row(req, aligned),
                self.comp.checkpoints_for(req, aligned, finishing),
                req.namespace,
                req.options.priority,
                req.prefix_len,
            )
            cached = out.cached
            self.comp.after_insert(req, out, aligned)
        if self.tiers is not None:
            self.tiers.on_insert(req, slots, cached, aligned)
        if cached < aligned:  # KV events hook: the tree adopted [cached, aligned)
            self.events.stored(req.tokens, slots, cached, aligned, req.namespace, req.prefix_len)
        if cached < req.prefix_len:
            raise RuntimeError(
                f"cache lost a locked prefix: insert found {cached} < locked {req.prefix_len}"
            )
        # Positions [prefix_len, cached) were already in the tree under other slots: ours there
        # are duplicates. The tree adopted ours for [cached, aligned).
        #
        #   position  0           prefix_len          cached               aligned      kv_len
        #             |-- tree ------|-- ours: dup ------|-- ours → tree ------|-- ours ----|
        #   after     locked (ours     freed here          tree owns them        stays in
        #             via handle)                         (adopted)             own_pages
        #   `own_pages[:handed]` covers [prefix_len, aligned): freed or adopted, never both.
        dup_pages = (min(cached, aligned) - req.prefix_len) // self.page_size
        if dup_pages:
            self.allocator.free_page_ids(req.own_pages[:dup_pages])
        return (aligned - req.prefix_len) // self.page_size

    def commit_prefix(self, req: Request) -> None:
        """After a prefill chunk: move the computed whole pages into the cache and the lock onto
        them, so later arrivals already hit the finished chunks."""
        if self.cache is None:
            return
        aligned = req.kv_len // self.page_size * self.page_size
        if aligned <= req.prefix_len:
            return
        handed = self._insert(req, aligned)
        if self.comp is None:
            m = self.cache.match(req.tokens[:aligned], req.namespace, record=False)
        else:
            m = self.cache.match_path(req.tokens[:aligned], req.namespace)  # type: ignore[attr-defined]
        if m.length != aligned:
            raise RuntimeError(f"prefix just inserted ({aligned}) matched only {m.length}")
        self.cache.lock(m.handle)
        self.unlock(req)
        req.handle = m.handle
        # The duplicate range now reads the tree's slots (same tokens, same positions → same KV).
        self.table.write(req.row, 0, np.asarray(m.slots[:aligned], dtype=np.int64))
        if self.comp is not None:
            self.comp.rewrite_prefix(req, m, aligned)
        req.own_pages = req.own_pages[handed:]
        req.prefix_len = aligned

    def release(self, req: Request) -> None:
        """Finish/abort/retract: computed whole pages go to the cache (if any), everything else
        is freed, the lock is dropped, the row is returned."""
        handed = 0
        if self.cache is not None:
            aligned = req.kv_len // self.page_size * self.page_size
            if aligned > req.prefix_len:
                handed = self._insert(req, aligned, finishing=True)
            self._hold_session(req, aligned)
        if handed < len(req.own_pages):
            self.allocator.free_page_ids(req.own_pages[handed:])
        if self.comp is not None:
            self.comp.release(req)
        self.unlock(req)
        self.table.free_row(req.row)
        req.row, req.kv_len, req.prefix_len, req.own_pages = -1, 0, 0, []

    def _hold_session(self, req: Request, aligned: int) -> None:
        """A request with a session_id leaves a session reference on the prefix it cached
        (session-aware eviction keeps it ahead of unreferenced prefixes until the close)."""
        sid = req.options.session_id
        hold = getattr(self.cache, "hold_session", None)
        if sid is None or hold is None or aligned <= 0:
            return
        assert self.cache is not None
        m = self.cache.match(req.tokens[:aligned], req.namespace, record=False)
        hold(sid, m.handle)

    def close_session(self, session_id: str) -> bool:
        """Drop the session's reference; False if the cache holds none for it."""
        release = getattr(self.cache, "release_session", None)
        return bool(release(session_id)) if release is not None else False

    # -- whole-pool operations ----------------------------------------------------------------
    def flush(self, idle: bool) -> None:
        """Drop every unlocked cached prefix (everything, when no request holds a lock)."""
        if self.cache is None:
            return
        if self.comp is not None:
            c: Any = self.cache
            everything = 1 << 62
            freed = c.reset_components() if idle else c.evict_components(everything, everything)
            self.comp._free(freed)
            if not idle:
                self.comp._free(c.evict_components(checkpoints=everything))
        elif idle:
            self.allocator.free_slots_of_pages(self.cache.reset())
            self.events.cleared()  # KV events hook
        else:
            evicted = self.cache.evict(self.cache.evictable_size)
            if self.tiers is not None:
                self.tiers.on_evict(evicted, demote=False)
            self.events.removed(evicted)  # KV events hook
            self.allocator.free_slots_of_pages(evicted)
        if self.tiers is not None:
            self.tiers.flush(device_reset=idle)

    def census(self, running: list[Request]) -> tuple[int, int, int]:
        """(free, cached-in-tree, held-by-running) slot counts."""
        cached = self.cache.total_size if self.cache is not None else 0
        held = sum(len(r.own_pages) for r in running) * self.page_size
        return self.allocator.free_slots, cached, held

    def check(self, running: list[Request]) -> None:
        """Raise unless the census balances and every running request's pages are owned."""
        self.allocator.check()
        free, cached, held = self.census(running)
        if free + cached + held != self.allocator.num_slots:
            raise RuntimeError(
                f"KV census broken: free {free} + cached {cached} + held {held} "
                f"!= pool {self.allocator.num_slots}"
            )
        seen: set[int] = set()
        for r in running:
            for p in r.own_pages:
                if p in seen or not self.allocator.is_allocated(p):
                    raise RuntimeError(f"page {p} of {r.request_id} is free or shared")
                seen.add(p)
            cap = self.capacity(r, self.page_size)
            if not r.prefix_len <= r.kv_len <= cap or self.table.capacity(r.row) < cap:
                raise RuntimeError(f"request {r.request_id} has inconsistent lengths")
        if self.comp is not None:
            self.comp.check(running)
        if self.cache is not None:
            self.cache.check_integrity()
        if self.tiers is not None:
            self.tiers.check(self.tree_pages())

    def tree_pages(self) -> set[int]:
        """Device pages the cache owns now (O(tree): for checks and shutdown)."""
        if self.cache is None:
            return set()
        return {int(p) for p in self.allocator.slots_to_pages(self.cache.cached_slots())}

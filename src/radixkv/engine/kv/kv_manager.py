"""Memory bookkeeping for running requests: the only code that moves slots between the three owners
(allocator free list, prefix cache, running requests) and writes the request→token table.

Census invariant, after every public call:
    allocator.free_slots + cache.total_size + sum(len(r.own_pages) for r running) * page_size
        == allocator.num_slots
Each page has exactly one owner. A running request's positions [0, prefix_len) are cache-owned
(locked through `handle`), [prefix_len, capacity) are its `own_pages`.

The host/storage tiers (`tiers`, engine/tiers/manager.py; `NoTiers` when there are none) are told
what the tree did and hand back load plans; they never move a device slot themselves. Requests held
at arrival for their storage pages wait in `held` (`hold_for_storage`, `poll_tiers`).

Every call that moves data in or out of the tree goes through `comp`, the tree-side memory, one
set of calls whatever the model: `PlainMemory` (engine/kv/plain_memory.py) for a FULL-only model,
whose per-request hooks do nothing, or `ComponentMemory` (engine/kv/components_kv.py) for a
hybrid one, which also owns every other kind's bookkeeping (one memory per kind) and the hybrid tree
(`radixkv.cache.HybridCache`). This class never asks which it has. `cache` is the tree, seen
through the contract every design shares (`PrefixIndex`: match, locks, sizes, checks); None when
the cache is off.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from radixkv.cache.base import PrefixCache, PrefixIndex
from radixkv.engine.events.kv_events import NULL_SINK, EventSink
from radixkv.engine.kv.components_kv import ComponentMemory
from radixkv.engine.kv.plain_memory import PlainMemory
from radixkv.engine.kv.tier_load import load_from_tiers
from radixkv.engine.request import Request
from radixkv.engine.tiers.prefetch import PrefetchHold
from radixkv.engine.tiers.tier_setup import NoTiers, Tiers
from radixkv.memory.allocator import PageAllocator
from radixkv.memory.req_table import ReqToTokenTable


class KVManager:
    def __init__(
        self,
        allocator: PageAllocator,
        table: ReqToTokenTable,
        cache: PrefixCache | None,
        comp: ComponentMemory | None = None,
        tiers: Tiers | None = None,
        events: EventSink = NULL_SINK,
    ) -> None:
        """`cache`: the FULL-only prefix cache (None when off, or for a hybrid model, whose
        tree `comp` holds; `comp` frees FULL slots into this `allocator`). `events`: the KV
        events sink (engine/events/kv_events.py), told where slots enter or leave the tree."""
        if comp is not None and cache is not None:
            raise ValueError("a hybrid model's prefix cache is its ComponentMemory's tree")
        if comp is not None and comp.full_alloc is not allocator:
            raise ValueError("ComponentMemory must free FULL slots into this allocator")
        self.allocator = allocator
        self.table = table
        self.cache: PrefixIndex | None = cache if comp is None else comp.cache
        self.page_size = allocator.page_size
        # The tree-side memory (see the module docstring); every hook is called unconditionally.
        self.comp: ComponentMemory | PlainMemory = (
            comp if comp is not None else PlainMemory(cache, allocator, events)
        )
        self.tiers: Tiers = tiers if tiers is not None else NoTiers()
        self.comp.tiers = self.tiers
        self.held = PrefetchHold()
        # KV events hooks: every `self.events.` call below (and PlainMemory's).
        self.events = events

    # -- allocation ---------------------------------------------------------------------------
    def available_pages(self) -> int:
        """Pages obtainable now: free ones plus those the cache could evict."""
        evictable = self.cache.evictable_size // self.page_size if self.cache is not None else 0
        return self.allocator.free_pages + evictable

    def alloc(self, num_pages: int) -> list[int] | None:
        """`num_pages` pages, evicting unlocked cached prefixes when short; None if impossible."""
        pages = self.allocator.alloc_pages(num_pages)
        if pages is None and self.cache is not None:
            self.comp.evict_full((num_pages - self.allocator.free_pages) * self.page_size)
            pages = self.allocator.alloc_pages(num_pages)
        return pages

    @staticmethod
    def capacity(req: Request, page_size: int) -> int:
        return req.prefix_len + len(req.own_pages) * page_size

    # -- admission ----------------------------------------------------------------------------
    def match_and_lock(self, req: Request) -> tuple[int, np.ndarray]:
        """Lock the longest cached prefix of all but the last token; (length, slots)."""
        if self.cache is None:
            return 0, np.empty(0, dtype=np.int64)
        m = self.comp.match(req, req.tokens[: len(req.tokens) - 1])
        if m.length > 0:
            self.cache.lock(m.handle)
            req.handle = m.handle
        slots = np.asarray(m.slots[: m.length], dtype=np.int64)
        self.tiers.on_l1_hit(slots)
        try:
            return self._load_from_tiers(req, m.length, slots)
        finally:
            self.tiers.end_match(req)

    def _load_from_tiers(
        self, req: Request, length: int, slots: np.ndarray
    ) -> tuple[int, np.ndarray]:
        """Continue req's locked L1 match through L2: the tiers plan which host pages follow it,
        this allocates device memory of every kind, the tiers copy them down, this inserts them
        into the tree and moves req's lock onto the longer prefix (engine/kv/tier_load.py, the
        same for every model). Returns the new (length, slots)."""
        return load_from_tiers(self, self.comp, req, length, slots)

    def hold_for_storage(self, req: Request) -> bool:
        """At arrival, with L3 storage: start fetching the prompt's pages past what L1 and L2
        hold; True when the prefetch policy holds `req` for them (`poll_tiers` gives it back,
        at the latest when its bound passes), False: schedule it now."""
        if not self.tiers.has_storage:
            return False
        l1 = 0
        if self.cache is not None:
            query = req.tokens[: (len(req.tokens) - 1) // self.page_size * self.page_size]
            l1 = self.cache.match(query, req.namespace, record=False).length
        bound = self.tiers.start_prefetch(req, l1)
        if bound is not None:
            self.held.add(req, bound)
        return bound is not None

    def poll_tiers(self, timeout: float = 0.0) -> list[Request]:
        """Land finished storage I/O; the held requests now due (prefetch done or bound passed),
        in arrival order, for the scheduler."""
        self.tiers.poll(timeout)
        due = self.held.due(self.tiers.prefetch_pending)
        for req in due:
            self.tiers.end_hold(req.request_id)
        return due

    def admit(self, req: Request, reserve_pages: int, match: bool = True) -> int | None:
        """Give `req` its memory, all or nothing: lock its longest cached prefix (through the
        tiers; `match` False: no lookup, as for the compile warm-up), take pages for the rest
        of its prompt (evicting when short) while `reserve_pages` more stay obtainable for the
        running requests, take what its other kinds need, and bind its table row. Returns the
        cached prefix length; None when it does not fit now, with nothing held (lock, pages
        and kinds given back)."""
        if match:
            prefix_len, prefix_slots = self.match_and_lock(req)
        else:
            prefix_len, prefix_slots = 0, np.empty(0, dtype=np.int64)
        need = self.allocator.pages_for(len(req.tokens)) - prefix_len // self.page_size
        pages = self.alloc(need) if need + reserve_pages <= self.available_pages() else None
        if pages is not None and not self.comp.reserve(req):
            self.allocator.free_page_ids(pages)
            pages = None
        if pages is None:
            self.unlock(req)
            return None
        self.bind(req, prefix_len, prefix_slots, pages)
        return prefix_len

    def unlock(self, req: Request) -> None:
        if req.handle is not None and self.cache is not None:
            self.cache.unlock(req.handle)
        req.handle = None
        self.comp.forget_match(req)

    def bind(
        self, req: Request, prefix_len: int, prefix_slots: np.ndarray, pages: list[int]
    ) -> None:
        """Give `req` a table row: cached prefix slots, then its own pages."""
        row = self.table.alloc_row()
        self.table.write(row, 0, prefix_slots)
        self.table.write(row, prefix_len, self.allocator.page_slots(pages))
        req.row, req.prefix_len, req.kv_len, req.own_pages = row, prefix_len, prefix_len, pages
        self.comp.bind(req, prefix_len)

    def grow(self, req: Request, new_len: int) -> bool:
        """Make sure positions < new_len have slots; False (nothing changed) if out of memory."""
        cap = self.capacity(req, self.page_size)
        if new_len > cap:
            pages = self.alloc(self.allocator.pages_for(new_len - cap))
            if pages is None:
                return False
            self.table.write(req.row, cap, self.allocator.page_slots(pages))
            req.own_pages.extend(pages)
        return self.comp.ensure(req, new_len)

    def prepare_chunk(self, req: Request, n: int) -> bool:
        """Hybrid: the SWA slots of the next `n` tokens (FULL pages come at admission)."""
        return self.comp.ensure(req, req.kv_len + n)

    def chunk_cap(self, req: Request) -> int:
        """Hybrid STATE: the longest prefill chunk that stops on the next checkpoint boundary."""
        return self.comp.chunk_cap(req)

    def after_step(self, req: Request, was_prefill: bool) -> None:
        self.comp.after_step(req, was_prefill)

    def fork(self, parent: Request, child: Request) -> tuple[np.ndarray, np.ndarray] | None:
        """Give `child` the parent's computed context [0, parent.kv_len) without recomputing it.

        The cache-owned prefix [0, prefix_len) is shared: the child locks the parent's handle
        again (reference counted) and reads the same slots. The parent's own computed positions
        [prefix_len, kv_len) (the partial tail page; everything when the cache is off) get fresh
        pages of the child's own. Returns (src, dst) FULL slots whose K/V the caller copies, or
        None (nothing changed) when no row or pages are free. A hybrid child gets copies of
        the parent's own SWA K/V and working state here (each kind's `bind_fork`).
        """
        if self.table.free_rows == 0:
            return None
        # Hybrid: the child also needs its own SWA pages and working state slot (copy-on-write
        # copies of the parent's, taken first so that a failure below can give them back).
        held = self.comp.reserve_fork(parent)
        if held is None:
            return None
        ps = self.page_size
        pre, kv_len = parent.prefix_len, parent.kv_len
        pages = self.alloc(self.allocator.pages_for(kv_len + 1) - pre // ps)
        if pages is None:
            self.comp.unreserve_fork(held)
            return None
        if parent.handle is not None and self.cache is not None:
            self.cache.lock(parent.handle)
        row = self.table.alloc_row()
        self.table.write(row, 0, self.table.get_numpy(parent.row, 0, pre))
        self.table.write(row, pre, self.allocator.page_slots(pages))
        child.row, child.prefix_len, child.kv_len = row, pre, kv_len
        child.handle, child.own_pages = parent.handle, pages
        self.comp.bind_fork(parent, child, held)
        return (
            self.table.get_numpy(parent.row, pre, kv_len),
            self.table.get_numpy(row, pre, kv_len),
        )

    # -- handing computed KV to the cache -----------------------------------------------------
    def _insert(self, req: Request, aligned: int, finishing: bool = False) -> tuple[int, Any]:
        """Insert tokens[:aligned] with their slots; free our duplicate pages; return how many
        leading pages of `own_pages` the cache now owns or were freed (the tree adopted them),
        and the handle covering tokens[:aligned]."""
        slots = self.table.get_numpy(req.row, 0, aligned)
        cached, handle = self.comp.insert(req, slots, aligned, finishing)
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
        return (aligned - req.prefix_len) // self.page_size, handle

    def commit_prefix(self, req: Request) -> None:
        """After a prefill chunk: move the computed whole pages into the cache and the lock onto
        them, so later arrivals already hit the finished chunks."""
        if self.cache is None:
            return
        aligned = req.kv_len // self.page_size * self.page_size
        if aligned <= req.prefix_len:
            return
        handed, handle = self._insert(req, aligned)
        self.cache.lock(handle)
        self.unlock(req)
        req.handle = handle
        # The duplicate range now reads the tree's slots (same tokens, same positions → same KV).
        self.table.write(req.row, 0, self.cache.slots_of(handle))
        self.comp.rewrite_prefix(req, handle)
        req.own_pages = req.own_pages[handed:]
        req.prefix_len = aligned

    def release(self, req: Request) -> None:
        """Finish/abort/retract: computed whole pages go to the cache (if any), everything else
        is freed, the lock is dropped, the row is returned."""
        handed = 0
        if self.cache is not None:
            aligned = req.kv_len // self.page_size * self.page_size
            handle = req.handle  # covers prefix_len, which is aligned when nothing is new
            if aligned > req.prefix_len:
                handed, handle = self._insert(req, aligned, finishing=True)
            self._hold_session(req, aligned, handle)
        if handed < len(req.own_pages):
            self.allocator.free_page_ids(req.own_pages[handed:])
        self.comp.release(req)
        self.unlock(req)
        self.table.free_row(req.row)
        req.row, req.kv_len, req.prefix_len, req.own_pages = -1, 0, 0, []

    def _hold_session(self, req: Request, aligned: int, handle: Any) -> None:
        """A request with a session_id leaves a session reference on the prefix it cached
        (`handle`; session-aware eviction keeps it ahead of unreferenced prefixes until the
        close)."""
        sid = req.options.session_id
        hold = getattr(self.cache, "hold_session", None)
        if sid is None or hold is None or aligned <= 0:
            return
        hold(sid, handle)

    def close_session(self, session_id: str) -> bool:
        """Drop the session's reference; False if the cache holds none for it."""
        release = getattr(self.cache, "release_session", None)
        return bool(release(session_id)) if release is not None else False

    def publish_events(self) -> None:
        """End of a step: what the lower tiers stored or dropped joins the step's KV events,
        which go out as one batch."""
        ops = self.tiers.residency_ops()
        if ops:
            self.events.tier_blocks(ops)
        self.events.end_step()

    # -- whole-pool operations ----------------------------------------------------------------
    def flush(self, idle: bool) -> None:
        """Drop every unlocked cached prefix (everything, when no request holds a lock)."""
        self.comp.flush(idle)
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
        self.comp.check(running)
        if self.cache is not None:
            self.cache.check_integrity()
        self.tiers.check()
        mapped = self.tiers.device_pages()
        stale = mapped - self.tree_pages() if mapped else set()
        if stale:
            raise RuntimeError(f"tiers map device pages the tree does not own: {sorted(stale)[:8]}")

    def tree_pages(self) -> set[int]:
        """Device pages the cache owns now (O(tree): for checks and shutdown)."""
        if self.cache is None:
            return set()
        return {int(p) for p in self.allocator.slots_to_pages(self.cache.cached_slots())}

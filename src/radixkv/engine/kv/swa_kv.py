"""SWA (sliding-window attention) memory of running requests: one kind of `KindMemory`
(engine/kv/kind_memory.py).

Census after every call: free + tree (`cache.held(SWA)`) + sum(len(h.pages)) * page_size
== the SWA pool. A running request owns the pages covering [lo, capacity); it gets them chunk by
chunk (`ensure`) and frees those that fell out of its window (`after_step`), so a long request
holds about W tokens plus a page or two. Its row of the SWA table (the runner's
`kind_slots[SWA]`) holds the tree's slots before `lo`, -1 for positions it no longer has.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from radixkv.cache.base import SlotArray
from radixkv.cache.hybrid.component import ComponentSpec
from radixkv.cache.hybrid.components import HybridInsert, HybridMatch
from radixkv.cache.hybrid.swa import SwaComponent
from radixkv.config import EngineConfig
from radixkv.engine.kv.kind_memory import KindSetup, holding
from radixkv.engine.kv.kind_sizing import SizeContext
from radixkv.engine.request import Request
from radixkv.memory.allocator import PageAllocator
from radixkv.memory.hybrid import FULL, SWA, PoolSpec
from radixkv.memory.pool import KVPool
from radixkv.memory.req_table import ReqToTokenTable


@dataclass(eq=False)
class SwaHold:
    """What a running request holds of the SWA pool: its own pages, covering
    [lo, lo + len(pages) * page_size)."""

    pages: list[int] = field(default_factory=list)
    lo: int = 0


def swa_demand(window: int, page_size: int, max_running: int, chunk: int) -> int:
    """The SWA pool a hybrid model needs by default, in tokens (whole pages): every running
    request's window plus two partial pages, one step's prefill chunk on top, and the windows
    of K = max(4, max_running // 4) cached prefixes (a window and a page each), so that at least
    K cached conversations stay resumable past the window under load. SWA K/V further back is
    never read again, so a pool sized for the windows, not for every token, loses nothing."""
    ps = page_size
    win = -(-window // ps) * ps
    cached = max(4, max_running // 4)
    return max_running * (win + 2 * ps) + -(-chunk // ps) * ps + cached * (win + ps)


class SwaSizing:
    """The SWA pool (engine/kv/kind_sizing.py): tokens of the sliding layers, in the byte
    budget. Unless --swa-slots is given, `swa_demand` (at most the FULL pool; a model without
    FULL layers keeps its whole budget for SWA), never below one request's window and chunk."""

    budgeted = True

    def slot_bytes(self, ctx: SizeContext) -> int:
        return ctx.spec.slot_bytes(SWA, ctx.dtype)

    def explicit(self, cfg: EngineConfig) -> int | None:
        return cfg.cache.swa_num_slots

    def demand(self, ctx: SizeContext) -> int | None:
        window = ctx.spec.window(SWA)
        if FULL not in ctx.spec or window is None:
            return None
        return swa_demand(window, ctx.page_size, ctx.max_running, ctx.chunk)

    def settle(self, n: int, ctx: SizeContext, explicit: bool) -> int:
        ps = ctx.page_size
        n = n // ps * ps
        least = ctx.pages((ctx.spec.window(SWA) or 0) + ctx.chunk) + 2 * ps
        if n < least:
            if explicit:
                raise ValueError(f"the SWA pool needs at least {least} slots (window + one chunk)")
            n = least  # the default never goes below what one request needs
        return n


def hold(req: Request) -> SwaHold:
    """req's SWA holding (made on first use)."""
    return holding(req, SWA, SwaHold)


def swa_component(spec: PoolSpec) -> ComponentSpec | None:
    """The tree's SWA component for a model of `spec` (its window), if it has SWA layers."""
    if SWA not in spec:
        return None
    window = spec.window(SWA)
    if window is None:
        raise ValueError("the SWA layers of this model declare no window")
    return ComponentSpec(SwaComponent, window)


def _pages(req: Request) -> list[int]:
    h = req.kv_kinds.get(SWA)
    return h.pages if h is not None else []


class SwaMemory:
    kind = SWA

    def __init__(self, pool: KVPool, setup: KindSetup) -> None:
        self.pool = pool
        self.page_size = setup.page_size
        self.window = setup.spec.window(SWA)
        self.alloc_ = PageAllocator(pool.num_slots, setup.page_size)
        self.table = ReqToTokenTable(setup.rows, setup.max_context, setup.device)
        self.cache = setup.cache
        self._evict = setup.evict
        self._prefix: dict[int, SlotArray | None] = {}  # id(req) -> matched SWA, until bind

    # -- allocation ----------------------------------------------------------------------------
    def alloc(self, num_pages: int) -> list[int] | None:
        """`num_pages` SWA pages, evicting the tree's when short; None if impossible."""
        pages = self.alloc_.alloc_pages(num_pages)
        if pages is None and self.cache is not None:
            self._evict(SWA, (num_pages - self.alloc_.free_pages) * self.page_size)
            pages = self.alloc_.alloc_pages(num_pages)
        return pages

    def free_pages(self, pages: list[int]) -> None:
        self.alloc_.free_page_ids(pages)

    def page_slots(self, pages: list[int]) -> np.ndarray:
        return self.alloc_.page_slots(pages)

    def take_freed(self, slots: SlotArray | None) -> None:
        """SWA slots the tree let go of, or refused (whole pages)."""
        if slots is not None and len(slots):
            self.alloc_.free_slots_of_pages(slots)

    # -- admission -----------------------------------------------------------------------------
    def on_match(self, req: Request, m: HybridMatch) -> None:
        self._prefix[id(req)] = m.kinds.get(SWA)

    def forget_match(self, req: Request) -> None:
        self._prefix.pop(id(req), None)

    def reserve(self, req: Request) -> bool:
        return True

    def unreserve(self, req: Request) -> None:
        return None

    def bind(self, req: Request, prefix_len: int) -> None:
        """The row reads the match's window (-1 before it)."""
        swa_prefix = self._prefix.pop(id(req), None)
        prefix = np.full(prefix_len, -1, dtype=np.int64)
        if swa_prefix is not None and prefix_len:
            prefix[:] = np.asarray(swa_prefix[:prefix_len])
        self.table.alloc_row_at(req.row)
        self.table.write(req.row, 0, prefix)
        h = hold(req)
        h.lo, h.pages = prefix_len, []

    # -- stepping ------------------------------------------------------------------------------
    def capacity(self, req: Request) -> int:
        h = hold(req)
        return h.lo + len(h.pages) * self.page_size

    def ensure(self, req: Request, end: int) -> bool:
        cap = self.capacity(req)
        if end <= cap:
            return True
        pages = self.alloc(self.alloc_.pages_for(end - cap))
        if pages is None:
            return False
        self.table.write(req.row, cap, self.alloc_.page_slots(pages))
        hold(req).pages.extend(pages)
        return True

    def chunk_cap(self, req: Request) -> int | None:
        return None

    def after_step(self, req: Request, was_prefill: bool) -> None:
        """Free own pages that fell out of the window."""
        if self.window is None:
            return
        ps, h = self.page_size, hold(req)
        keep_from = req.kv_len // ps * ps - self.window
        drop = max(0, (keep_from - h.lo) // ps) if keep_from > 0 else 0
        drop = min(drop, len(h.pages))
        if drop:
            self._drop_own(req, drop, free=True)

    def _drop_own(self, req: Request, n: int, *, free: bool) -> None:
        """Give up the first `n` own pages (freed, or already handed to the tree)."""
        h = hold(req)
        pages, h.pages = h.pages[:n], h.pages[n:]
        if free:
            self.alloc_.free_page_ids(pages)
        lo = h.lo
        h.lo += n * self.page_size
        self.table.write(req.row, lo, np.full(h.lo - lo, -1, dtype=np.int64))

    def batch_slots(
        self, reqs: Sequence[Request], rows: list[int], ends: list[int]
    ) -> torch.Tensor:
        return self.table.gather(rows, ends)

    # -- the tree ------------------------------------------------------------------------------
    def tree_part(self, req: Request, aligned: int, finishing: bool) -> np.ndarray:
        """The SWA row of positions [0, aligned) (-1 where freed)."""
        return self.table.get_numpy(req.row, 0, aligned)

    def after_insert(self, req: Request, part: Any, out: HybridInsert, aligned: int) -> None:
        self.take_freed(out.refused.get(SWA))
        h = hold(req)
        if aligned > h.lo:
            n = (aligned - h.lo) // self.page_size
            self._drop_own(req, min(n, len(h.pages)), free=False)

    def rewrite_prefix(self, req: Request, handle: Any) -> None:
        """The row reads the tree's slots of the locked prefix (-1 outside the window)."""
        swa = None if self.cache is None else self.cache.part_of(SWA, handle)
        if swa is not None:
            self.table.write(req.row, 0, swa)

    # -- tier loads (TierKind) -----------------------------------------------------------------
    def tier_part(self, part: Any, out: HybridInsert) -> Any:
        """The row handed to the tree (the tiers keep the windows before its boundaries)."""
        return part

    def load_alloc(self, n: int) -> list[int] | None:
        return self.alloc(n)

    def load_free(self, units: list[int]) -> None:
        self.free_pages(units)

    def loaded_part(self, pages: list[int], units: list[int], boundary: int) -> np.ndarray:
        """The SWA row of [0, boundary): the loaded pages' slots, -1 elsewhere."""
        ps = self.page_size
        row = np.full(boundary, -1, dtype=np.int64)
        for p, dev in zip(pages, units, strict=True):
            row[p * ps : (p + 1) * ps] = self.alloc_.page_slots([dev])
        return row

    # -- forks -----------------------------------------------------------------------------------
    def reserve_fork(self, parent: Request) -> list[int] | None:
        """Pages for a fork's own copies of the parent's own positions [lo, kv_len)."""
        n = self.alloc_.pages_for(max(0, parent.kv_len - hold(parent).lo))
        return self.alloc(n) if n else []

    def unreserve_fork(self, held: list[int]) -> None:
        if held:
            self.alloc_.free_page_ids(held)

    def bind_fork(self, parent: Request, child: Request, held: list[int]) -> None:
        """`child` reads the parent's row up to lo (the tree's window, -1 before it) and copies
        of the parent's own K/V after it."""
        lo, kv = hold(parent).lo, parent.kv_len
        h = hold(child)
        h.lo, h.pages = lo, held
        self.table.alloc_row_at(child.row)
        self.table.write(child.row, 0, self.table.get_numpy(parent.row, 0, lo))
        dst = self.alloc_.page_slots(held)
        self.table.write(child.row, lo, dst)
        self.pool.copy_slots(self.table.get_numpy(parent.row, lo, kv), dst[: kv - lo])

    # -- the end, and the books ------------------------------------------------------------------
    def release(self, req: Request) -> None:
        h = req.kv_kinds.pop(SWA, None)
        if h is not None:
            self.alloc_.free_page_ids(h.pages)
        self.table.free_row(req.row)

    def census(self, running: Sequence[Request]) -> dict[str, int]:
        held = sum(len(_pages(r)) for r in running) * self.page_size
        return {
            "size": self.alloc_.num_slots,
            "free": self.alloc_.free_slots,
            "cached": self.cache.held(SWA) if self.cache is not None else 0,
            "held": held,
        }

    def check(self, running: Sequence[Request]) -> None:
        self.alloc_.check()
        seen: set[int] = set()
        for r in running:
            for p in _pages(r):
                if p in seen or not self.alloc_.is_allocated(p):
                    raise RuntimeError(f"SWA page {p} of {r.request_id} is free or shared")
                seen.add(p)

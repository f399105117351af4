"""Page allocator: a free list over the KV pool's token slots.

The pool's `num_slots` slots are cut into `num_pages` pages of `page_size` contiguous slots; page p
is slots [p * page_size, (p + 1) * page_size). Allocating or freeing k pages costs O(k) (a Python
list used as a stack plus a per-page ownership bit), never O(pool).

Ownership invariant: every page is either on the free list (`_allocated[p]` is False) or owned by
exactly one holder outside the allocator (a running request or the prefix cache). Freeing a page
that is already free, or a slot range that is not whole pages, raises.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]


class AllocationError(RuntimeError):
    """Raised on double free, freeing slots that are not whole pages, or out-of-range slots."""


class PageAllocator:
    """Hands out whole pages of KV slots; tracks which pages are free."""

    def __init__(self, num_slots: int, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        if num_slots < page_size:
            raise ValueError(f"num_slots={num_slots} is smaller than one page ({page_size})")
        self.page_size = page_size
        self.num_pages = num_slots // page_size
        # Slots past the last whole page are never handed out.
        self.num_slots = self.num_pages * page_size
        # Stack of free page ids; popping from the end hands out low page ids first.
        self._free: list[int] = list(range(self.num_pages - 1, -1, -1))
        self._allocated = np.zeros(self.num_pages, dtype=bool)
        self.reserved_slots = 0  # slots taken out of the range for good (`reserve_tail`)

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def free_slots(self) -> int:
        return len(self._free) * self.page_size

    @property
    def used_slots(self) -> int:
        return self.num_slots - self.free_slots

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold `num_tokens` tokens (ceil division)."""
        return -(-num_tokens // self.page_size)

    def alloc_pages(self, num_pages: int) -> list[int] | None:
        """`num_pages` page ids, or None (nothing taken) when fewer are free."""
        if num_pages < 0:
            raise ValueError("num_pages must be >= 0")
        if num_pages > len(self._free):
            return None
        if num_pages == 0:
            return []
        pages = self._free[-num_pages:]
        del self._free[-num_pages:]
        self._allocated[pages] = True
        return pages

    def free_page_ids(self, pages: Sequence[int] | IntArray) -> None:
        """Return pages to the free list. All-or-nothing: raises before changing anything."""
        arr = np.asarray(pages, dtype=np.int64)
        if arr.size == 0:
            return
        if arr.min() < 0 or arr.max() >= self.num_pages:
            raise AllocationError(f"page id out of range [0, {self.num_pages})")
        if not bool(self._allocated[arr].all()):
            bad = arr[~self._allocated[arr]][:8].tolist()
            raise AllocationError(f"double free of page(s) {bad}")
        if np.unique(arr).size != arr.size:
            raise AllocationError("the same page appears twice in one free call")
        self._allocated[arr] = False
        self._free.extend(arr.tolist())

    def slots_to_pages(self, slots: Sequence[int] | IntArray) -> IntArray:
        """Page ids of `slots`, which must be whole pages laid out in order (page-aligned runs)."""
        arr = np.asarray(slots, dtype=np.int64)
        ps = self.page_size
        if arr.size % ps:
            raise AllocationError(f"{arr.size} slots are not whole pages of {ps}")
        if ps == 1:
            return arr
        grid = arr.reshape(-1, ps)
        starts = grid[:, 0]
        if (starts % ps).any() or (grid != starts[:, None] + np.arange(ps)).any():
            raise AllocationError("slots are not whole, page-aligned pages")
        return starts // ps

    def free_slots_of_pages(self, slots: Sequence[int] | IntArray) -> None:
        """Free slots given as whole pages (e.g. what the cache's evict/reset returned)."""
        self.free_page_ids(self.slots_to_pages(slots))

    def page_slots(self, pages: Sequence[int] | IntArray) -> IntArray:
        """The slots of `pages`, in order: page p contributes p*ps .. p*ps+ps-1."""
        arr = np.asarray(pages, dtype=np.int64)
        ps = self.page_size
        if ps == 1:
            return arr.copy()
        return (arr[:, None] * ps + np.arange(ps, dtype=np.int64)).reshape(-1)

    def reserve_tail(self) -> int:
        """Take the last page out of the allocator's range for good and return its first slot
        (the decode graphs' scratch slot, radixkv.engine.graph_runner). Only before anything is
        handed out. `num_pages` / `num_slots` shrink by one page, so the census free + cached +
        held == num_slots still balances, and the page can never be handed out or freed (its
        id is out of range); the pool's tensors keep it: pool slots == num_slots +
        reserved_slots."""
        if self.num_pages < 2:
            raise ValueError("reserving a page needs a pool of at least two pages")
        if self.free_pages != self.num_pages:
            raise AllocationError("reserve_tail before any page is handed out")
        last = self.num_pages - 1
        self._free.remove(last)
        self._allocated = self._allocated[:last].copy()
        self.num_pages = last
        self.num_slots -= self.page_size
        self.reserved_slots += self.page_size
        return last * self.page_size

    def is_allocated(self, page: int) -> bool:
        return bool(self._allocated[page])

    def check(self) -> None:
        """Free list and ownership bits agree (O(pool); for tests and check_memory)."""
        free = np.asarray(self._free, dtype=np.int64)
        if np.unique(free).size != free.size:
            raise AllocationError("free list holds a page twice")
        if free.size and self._allocated[free].any():
            raise AllocationError("a free-listed page is marked allocated")
        if int(self._allocated.sum()) + free.size != self.num_pages:
            raise AllocationError("allocated + free != num_pages")

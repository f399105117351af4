from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from radixkv.memory.allocator import AllocationError, PageAllocator
from radixkv.memory.req_table import ReqToTokenTable


def test_pages_are_contiguous_and_aligned() -> None:
    a = PageAllocator(64, page_size=16)
    assert a.num_pages == 4 and a.free_slots == 64
    pages = a.alloc_pages(3)
    assert pages is not None and len(set(pages)) == 3
    slots = a.page_slots(pages)
    for j, p in enumerate(pages):
        run = slots[j * 16 : (j + 1) * 16]
        assert run[0] == p * 16 and (np.diff(run) == 1).all()
    assert a.free_slots == 16 and a.used_slots == 48
    assert a.alloc_pages(2) is None and a.free_pages == 1  # all-or-nothing
    a.free_slots_of_pages(slots)
    assert a.free_slots == 64
    a.check()


def test_num_slots_rounded_down_to_whole_pages() -> None:
    a = PageAllocator(70, page_size=16)
    assert a.num_slots == 64 and a.num_pages == 4
    with pytest.raises(ValueError):
        PageAllocator(8, page_size=16)


def test_double_free_and_bad_slots_raise() -> None:
    a = PageAllocator(32, page_size=4)
    pages = a.alloc_pages(2)
    assert pages is not None
    a.free_page_ids(pages[:1])
    with pytest.raises(AllocationError, match="double free"):
        a.free_page_ids(pages[:1])
    with pytest.raises(AllocationError):
        a.free_page_ids([pages[1], pages[1]])  # same page twice in one call
    assert a.is_allocated(pages[1])  # the failed call changed nothing
    with pytest.raises(AllocationError):
        a.free_page_ids([99])
    base = pages[1] * 4
    with pytest.raises(AllocationError, match="whole"):
        a.free_slots_of_pages([base, base + 1])  # half a page
    with pytest.raises(AllocationError, match="page-aligned"):
        a.free_slots_of_pages([base + 1, base + 2, base + 3, base + 4])
    a.check()


def test_never_freed_page_is_not_free() -> None:
    a = PageAllocator(8, page_size=1)
    with pytest.raises(AllocationError):
        a.free_page_ids([3])  # never allocated


def test_alloc_free_cost_is_independent_of_pool_size() -> None:
    # 4M pages: an O(pool) scan per call would take seconds for 2,000 calls.
    a = PageAllocator(1 << 22, page_size=1)
    start = time.perf_counter()
    for _ in range(2000):
        pages = a.alloc_pages(4)
        assert pages is not None
        a.free_page_ids(pages)
    assert time.perf_counter() - start < 1.0
    assert a.free_pages == 1 << 22


def test_req_table_rows_and_bounds() -> None:
    t = ReqToTokenTable(max_requests=2, max_context=8)
    r0, r1 = t.alloc_row(), t.alloc_row()
    with pytest.raises(RuntimeError):
        t.alloc_row()
    t.write(r0, 0, [5, 6, 7])
    t.write(r0, 3, np.array([1, 2]))
    assert t.get(r0, 0, 5).tolist() == [5, 6, 7, 1, 2]
    with pytest.raises(IndexError):
        t.get(r0, 0, 6)  # past the capacity
    with pytest.raises(IndexError):
        t.write(r1, 2, [1])  # would leave a hole
    with pytest.raises(IndexError):
        t.write(r0, 5, list(range(4)))  # past max_context
    t.free_row(r0)
    with pytest.raises(RuntimeError):
        t.free_row(r0)
    assert t.capacity(t.alloc_row()) == 0
    assert t.slots.dtype == torch.int64

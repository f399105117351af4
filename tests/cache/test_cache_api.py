"""Contract details of both cache designs: pages, splits, namespaces, inputs, errors, stats."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixkv.cache import BlockHashCache, RadixCache
from radixkv.cache.keys import TOKEN_BYTES, token_key
from radixkv.cache.node import common_pages

BOTH = [RadixCache, BlockHashCache]


@pytest.mark.parametrize("cls", BOTH)
def test_page_floor_on_insert_and_match(cls: Any) -> None:
    cache = cls(page_size=4)
    toks = list(range(10))
    assert cache.insert(toks, np.arange(100, 110)).cached == 0
    assert cache.total_size == 8  # the partial page stays the caller's
    res = cache.match(toks)
    assert res.length == 8 and res.slots.tolist() == list(range(100, 108))
    assert cache.match(toks[:7]).length == 4
    assert cache.match(toks[:3]).length == 0
    assert cache.insert(toks[:9], np.arange(200, 209)).cached == 8
    assert cache.total_size == 8
    cache.check_integrity()


def test_match_inside_an_edge_splits_so_the_handle_covers_exactly_the_prefix() -> None:
    cache = RadixCache(page_size=2)
    cache.insert(list(range(12)), np.arange(12))
    res = cache.match([0, 1, 2, 3, 4, 99])
    assert res.length == 4  # floored to whole pages
    cache.lock(res.handle)
    assert cache.protected_size == 4 and cache.evictable_size == 8
    cache.check_integrity()
    assert sorted(cache.evict(100).tolist()) == list(range(4, 12))
    cache.unlock(res.handle)
    assert cache.evictable_size == 4
    cache.check_integrity()


def test_split_parent_inherits_lock() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], np.arange(4))
    deep = cache.match([1, 2, 3, 4]).handle
    cache.lock(deep)
    cache.match([1, 2, 9])  # splits the locked edge after 2 tokens
    cache.check_integrity()
    assert cache.protected_size == 4
    cache.unlock(deep)
    assert cache.protected_size == 0 and cache.evictable_size == 4
    cache.check_integrity()


@pytest.mark.parametrize("cls", BOTH)
def test_namespaces_never_share(cls: Any) -> None:
    cache = cls(page_size=2)
    toks = [5, 6, 7, 8]
    cache.insert(toks, [0, 1, 2, 3], namespace="adapter-a")
    assert cache.match(toks).length == 0
    assert cache.match(toks, namespace="adapter-b").length == 0
    assert cache.insert(toks, [10, 11, 12, 13]).cached == 0  # None is a namespace too
    assert cache.match(toks).slots.tolist() == [10, 11, 12, 13]
    assert cache.match(toks, namespace="adapter-a").slots.tolist() == [0, 1, 2, 3]
    cache.check_integrity()


@pytest.mark.parametrize("cls", BOTH)
def test_input_types_agree(cls: Any) -> None:
    cache = cls(page_size=1)
    toks = [3, 1, 4, 1, 5, 9, 2, 6]
    cache.insert(np.array(toks, dtype=np.int32), np.arange(8, dtype=np.int32))
    for query in (toks, tuple(toks), np.array(toks, dtype=np.int64), np.array(toks)[::1]):
        res = cache.match(query)
        assert res.length == 8 and res.slots.dtype == np.int64
    assert cache.match(np.array(toks[::-1])[::-1]).length == 8  # non-contiguous view
    assert cache.match([3, 1, 4, 2**40]).length == 3  # large ids are fine


@pytest.mark.parametrize("cls", BOTH)
def test_errors(cls: Any) -> None:
    cache = cls(page_size=1)
    with pytest.raises(ValueError, match="len"):
        cache.insert([1, 2, 3], [0, 1])
    with pytest.raises(TypeError):
        cache.insert([1, 2.5], [0, 1])
    with pytest.raises(ValueError):
        cache.match(np.zeros((2, 2), dtype=np.int64))
    cache.insert([1, 2], [0, 1])
    res = cache.match([1, 2])
    with pytest.raises(ValueError):
        cache.unlock(res.handle)
    cache.lock(res.handle)
    cache.unlock(res.handle)
    with pytest.raises(ValueError):
        cache.unlock(res.handle)
    cache.lock(None)  # an empty match has no handle; locking it is a no-op
    cache.unlock(None)
    with pytest.raises(ValueError):
        cls(page_size=0)


@pytest.mark.parametrize("cls", BOTH)
def test_slots_returned_are_copies(cls: Any) -> None:
    cache = cls(page_size=1)
    slots = np.arange(4)
    cache.insert([1, 2, 3, 4], slots)
    slots[:] = -1  # the caller reuses its buffer
    res = cache.match([1, 2, 3, 4])
    assert res.slots.tolist() == [0, 1, 2, 3]
    res.slots[0] = 7  # the caller owns a fresh copy
    assert cache.match([1, 2, 3, 4]).slots.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("cls", BOTH)
def test_stats_and_reset(cls: Any) -> None:
    cache = cls(page_size=2)
    cache.insert([1, 2, 3, 4], [0, 1, 2, 3])
    cache.match([1, 2, 3, 4, 5, 6])
    cache.match([9, 9])
    cache.match([1, 2], record=False)
    st = cache.stats()
    assert (st.matched_tokens, st.requested_tokens, st.match_calls) == (4, 8, 2)
    assert (st.inserted_tokens, st.insert_calls) == (4, 1)
    assert st.hit_rate == 0.5
    h = cache.match([1, 2]).handle
    cache.lock(h)
    assert sorted(cache.reset().tolist()) == [0, 1, 2, 3]
    assert cache.total_size == cache.protected_size == 0
    with pytest.raises(ValueError):
        cache.unlock(h)
    assert cache.match([1, 2]).length == 0
    cache.check_integrity()
    cache.reset_stats()
    assert cache.stats().match_calls == 0


def test_check_integrity_detects_corruption() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3], [0, 1, 2])
    cache.insert([1, 2, 4], [5, 6, 7])
    cache._evictable += 1
    with pytest.raises(AssertionError, match="sizes"):
        cache.check_integrity()
    cache._evictable -= 1
    leaf = cache.match([1, 2, 4]).handle
    leaf.slots = np.array([1])
    with pytest.raises(AssertionError, match="writable"):
        cache.check_integrity()
    leaf.slots.flags.writeable = False
    with pytest.raises(AssertionError, match="slots held twice"):
        cache.check_integrity()


def test_import_does_not_pull_torch() -> None:
    code = "import sys, radixkv.cache, radixkv.cache.radix; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@given(
    a=st.lists(st.integers(0, 1), min_size=1, max_size=40),
    b=st.lists(st.integers(0, 1), min_size=1, max_size=40),
    page=st.sampled_from([1, 2, 4]),
    pad=st.integers(0, 3),
)
def test_common_pages_matches_brute_force(a: list[int], b: list[int], page: int, pad: int) -> None:
    """The galloping search equals a linear scan (given the first page matches)."""
    a, b = a[: len(a) - len(a) % page], b[: len(b) - len(b) % page]
    if not a or not b or a[:page] != b[:page]:
        return
    q = token_key([7] * pad + a)
    key = token_key(b)
    limit = min(len(a), len(b)) // page
    want = 0
    while want < limit and a[want * page : (want + 1) * page] == b[want * page : (want + 1) * page]:
        want += 1
    assert common_pages(q, pad * TOKEN_BYTES, key, limit, page * TOKEN_BYTES) == want


def test_check_integrity_detects_lock_and_queue_corruption() -> None:
    cache = RadixCache(policy="mru")
    cache.insert([1, 2, 3], [0, 1, 2])
    cache.insert([1, 2, 4], [5, 6, 7])
    leaf = cache.match([1, 2, 4]).handle
    cache.lock(leaf)
    leaf.parent.lock = 0  # a parent with fewer locks than its child
    with pytest.raises(AssertionError, match="exceeds its parent"):
        cache.check_integrity()
    leaf.parent.lock = 1
    cache.unlock(leaf)
    cache.check_integrity()
    leaf.last_access += 100  # an MRU entry whose key no longer matches its node
    with pytest.raises(AssertionError, match="leaf entry key"):
        cache.check_integrity()


def test_blockhash_integrity_detects_corruption() -> None:
    cache = BlockHashCache(page_size=2)
    cache.insert([1, 2, 3, 4], [0, 1, 2, 3])
    cache.check_integrity()
    first = cache.match([1, 2]).handle[0]
    first.num_children = 0
    with pytest.raises(AssertionError, match="child count"):
        cache.check_integrity()
    first.num_children = 1
    cache._free.move_to_end(first.block_id, last=False)  # parent ahead of its child
    with pytest.raises(AssertionError, match="before its child"):
        cache.check_integrity()


@pytest.mark.parametrize("cls", BOTH)
def test_returned_arrays_are_owned_and_writable(cls: Any) -> None:
    cache = cls(page_size=1)
    cache.insert([1, 2], [0, 1])
    for arr in (cache.match([1, 2]).slots, cache.match([5]).slots, cache.evict(1)):
        assert arr.flags.writeable and arr.dtype == np.int64
    cache.insert([1, 2], [0, 1])
    assert cache.reset().flags.writeable


@pytest.mark.parametrize("cls", BOTH)
def test_emptied_namespaces_are_forgotten(cls: Any) -> None:
    cache = cls(page_size=2)
    # less than a page: nothing stored
    assert cache.insert([1], [0], namespace="short") == (0, None)
    for i in range(50):
        cache.insert([i, i], [2 * i, 2 * i + 1], namespace=("session", i))
    assert len(cache._roots) == 50
    cache.evict(10**6)
    assert not cache._roots
    cache.check_integrity()
    cache.insert([1, 1], [0, 1], namespace=("session", 1))  # a fresh root, no stale keys
    assert cache.match([1, 1], namespace=("session", 1)).slots.tolist() == [0, 1]
    cache.check_integrity()

"""Host (L2) index: exact census under random operations, and chained page hashes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.cache.tiers import HostIndex, chain_hashes, namespace_seed


def test_chain_hashes_are_prefix_stable_and_namespaced() -> None:
    toks = list(range(40))
    seed = namespace_seed("model-a", None)
    full = chain_hashes(toks, 4, seed)
    assert len(full) == 10
    assert chain_hashes(toks[:17], 4, seed) == full[:4]  # partial page ignored
    assert chain_hashes(toks, 4, seed, full[:3]) == full  # extending equals recomputing
    # Same tokens, another model or another tenant: no key in common.
    for other in (namespace_seed("model-b", None), namespace_seed("model-a", "tenant")):
        assert not set(chain_hashes(toks, 4, other)) & set(full)
    # Chained: the same page after a different prefix gets a different key.
    assert chain_hashes([9, 9, 9, 9, *toks[4:8]], 4, seed)[1] != full[1]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.lists(st.integers(0, 5), min_size=1, max_size=80), st.randoms())
def test_host_index_census_random_ops(num_pages: int, ops: list[int], rnd: random.Random) -> None:
    idx = HostIndex(num_pages)
    pins: list[int] = []
    n_hash = 0
    for op in ops:
        if op <= 1:  # alloc + add
            n = rnd.randint(1, num_pages)
            got = idx.alloc(n)
            if got is None:
                assert n > idx.free_pages + idx.cached_pages
            else:
                assert len(set(got)) == n and not set(got) & set(pins)
                for p in got:
                    n_hash += 1
                    idx.add(n_hash.to_bytes(16, "little"), p)
        elif op == 2 and idx.cached_pages + idx.held_pages:  # pin something indexed
            h = rnd.randint(1, n_hash).to_bytes(16, "little")
            p = idx.lookup(h)
            if p is not None:
                idx.pin(p)
                pins.append(p)
        elif op == 3 and pins:
            idx.unpin(pins.pop(rnd.randrange(len(pins))))
        elif op == 4:
            idx.clear()
        elif op == 5:
            got = idx.alloc(1)
            if got is not None:
                idx.release(got)  # abandoned copy goes straight back
        idx.check()
        free, cached, held = idx.census()
        assert free + cached + held == num_pages
        assert held == len(set(pins))
        for p in pins:  # a pinned page is never dropped or reused
            assert idx.hash_of(p) is not None


def test_pinned_pages_survive_pressure() -> None:
    idx = HostIndex(2)
    a, b = idx.alloc(2) or []
    idx.add(b"a" * 16, a)
    idx.add(b"b" * 16, b)
    idx.pin(a)
    assert idx.alloc(2) is None  # only one unpinned page could be dropped
    got = idx.alloc(1)
    assert got == [b] and idx.lookup(b"a" * 16) == a and idx.lookup(b"b" * 16) is None
    with pytest.raises(ValueError):
        idx.unpin(b)

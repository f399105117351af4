"""Session-aware eviction: unreferenced first, then fewer references, then the base policy."""

from __future__ import annotations

import random

import numpy as np
import pytest

from radixkv.cache import RadixCache, available_policies, make_policy


def seq(first: int, n: int = 4) -> list[int]:
    return [first + i for i in range(n)]


def insert(cache: RadixCache, toks: list[int], base: int) -> None:
    cache.insert(toks, np.arange(base, base + len(toks)))


def owners(cache: RadixCache) -> list[int]:
    """Evict page by page; the slot base (a multiple of 100) names each leaf, in order."""
    order: list[int] = []
    while cache.evictable_size:
        base = int(cache.evict(1)[0]) // 100 * 100
        if not order or order[-1] != base:
            order.append(base)
        cache.check_integrity()
    return order


def test_unreferenced_then_fewer_references_then_lru() -> None:
    cache = RadixCache(policy="session-lru")
    for i, first in enumerate((10, 20, 30, 40)):
        insert(cache, seq(first), 100 * (i + 1))
    # LRU alone would evict 100, 200, 300, 400. Sessions: A holds 100, B and C hold 200.
    cache.hold_session("A", cache.match(seq(10), record=False).handle)
    cache.hold_session("B", cache.match(seq(20), record=False).handle)
    cache.hold_session("C", cache.match(seq(20), record=False).handle)
    cache.check_integrity()
    assert owners(cache) == [300, 400, 100, 200]


def test_close_puts_the_prefix_back_in_base_order() -> None:
    cache = RadixCache(policy="session-lru")
    insert(cache, seq(10), 100)
    insert(cache, seq(20), 200)
    cache.hold_session("A", cache.match(seq(10), record=False).handle)
    assert cache.release_session("A") and not cache.release_session("A")
    assert cache.open_sessions == 0
    assert owners(cache) == [100, 200]


def test_a_new_request_moves_the_reference_and_shared_prefixes_count_once_per_session() -> None:
    cache = RadixCache(policy="session-lru")
    trunk = seq(1000, 8)
    insert(cache, [*trunk, *seq(10)], 100)
    insert(cache, [*trunk, *seq(20)], 200)
    insert(cache, seq(30), 300)
    cache.hold_session("S", cache.match([*trunk, *seq(10)], record=False).handle)
    cache.hold_session("S", cache.match([*trunk, *seq(20)], record=False).handle)
    cache.check_integrity()
    trunk_node = cache.match(trunk, record=False).handle
    assert trunk_node.sref == 1  # one session, one reference, though it moved
    # The old branch (slots 1xx) lost its reference: plain LRU with 300 before the session's
    # current branch (2xx); the shared trunk (also 1xx) goes last.
    assert owners(cache) == [100, 300, 200, 100]


@pytest.mark.parametrize("page", [1, 4])
def test_trimming_a_referenced_leaf_moves_its_reference_up(page: int) -> None:
    cache = RadixCache(page_size=page, policy="session-lru")
    toks = seq(10, 4 * page)
    insert(cache, toks, 100)
    cache.hold_session("A", cache.match(toks, record=False).handle)
    cache.evict(page)  # the tail page of the referenced leaf
    cache.check_integrity()
    head = cache.match(toks, record=False).handle
    assert head.sref == 1 and head.anchors
    cache.evict(10**6)
    cache.check_integrity()
    assert not cache.release_session("B") and cache.release_session("A")


def test_reset_drops_references() -> None:
    cache = RadixCache(policy="session-lru")
    insert(cache, seq(10), 100)
    cache.hold_session("A", cache.match(seq(10), record=False).handle)
    cache.reset()
    assert cache.open_sessions == 0
    cache.check_integrity()


def test_session_wrapper_names() -> None:
    assert "session-lru" in available_policies()
    assert make_policy("session-lfu").name == "session-lfu"
    with pytest.raises(ValueError):
        make_policy("session-nope")


@pytest.mark.parametrize("policy", ["session-lru", "session-lfu", "session-fifo", "lru"])
def test_random_sessions_keep_counts_and_order(policy: str) -> None:
    """Random inserts, matches, session holds/closes and evictions: integrity (sref recount)
    after every step, and every eviction takes a leaf with the smallest (sref, base key)."""
    rng = random.Random(len(policy))
    cache = RadixCache(page_size=2, policy=policy)
    session_aware = policy.startswith("session-")
    seqs: list[list[int]] = [[]]
    slot = 0
    for _ in range(400):
        op = rng.random()
        if op < 0.4:
            toks = rng.choice(seqs[-10:])[:] + [rng.randrange(3) for _ in range(rng.randint(2, 6))]
            cache.insert(toks, np.arange(slot, slot + len(toks)))
            slot += len(toks)
            seqs.append(toks)
        elif op < 0.6:
            m = cache.match(rng.choice(seqs[-10:]), record=rng.random() < 0.5)
            if m.length:
                cache.hold_session(rng.choice("ABCD"), m.handle)
        elif op < 0.7:
            cache.release_session(rng.choice("ABCD"))
        else:
            leaves = cache._leaves.tracked()
            if session_aware and leaves:
                best = min(cache.policy.key(n)[0] for n in leaves)
                out = cache.evict(1)
                gone = [n for n in leaves if not n.alive or n.ntok < 0]
                assert len(out) == 2
                assert all(n.sref == best for n in gone) or not gone
            else:
                cache.evict(rng.choice([1, 2, 5]))
        cache.check_integrity()

"""Belady's offline optimum against brute force over every eviction choice on tiny traces."""

from __future__ import annotations

import random
from functools import cache

import numpy as np
import pytest

from radixkv.cache import RadixCache
from radixkv.cache.policies.research.belady import NEVER, belady, next_uses, page_keys

Trace = tuple[tuple[str, ...], ...]


def random_trace(seed: int, n: int) -> Trace:
    """Requests as chains of page names: a request extends a prefix of an earlier one."""
    rng = random.Random(seed)
    out: list[tuple[str, ...]] = []
    fresh = 0
    for _ in range(n):
        base: tuple[str, ...] = ()
        if out and rng.random() < 0.75:
            prev = rng.choice(out)
            base = prev[: rng.randint(0, len(prev))]
        ext = []
        for _ in range(rng.randint(0 if base else 1, 2)):
            ext.append(f"p{fresh}")
            fresh += 1
        out.append(base + tuple(ext))
    return tuple(out)


def keys_of(trace: Trace) -> list[list[tuple[str, ...]]]:
    """A page's key is its whole prefix (so equal keys mean equal prefixes)."""
    return [[req[: j + 1] for j in range(len(req))] for req in trace]


def brute_force(trace: Trace, cap: int) -> int:
    """Max total hit pages over ALL choices of what to keep after each request (any subset of
    at most `cap` pages, prefix-closed or not; a hit counts leading cached pages only)."""
    keys = keys_of(trace)

    @cache
    def best(t: int, state: frozenset[tuple[str, ...]]) -> int:
        if t == len(keys):
            return 0
        req = keys[t]
        hit = 0
        while hit < len(req) and req[hit] in state:
            hit += 1
        pool = sorted(state | set(req))
        top = 0
        n = len(pool)
        for mask in range(1 << n):
            if bin(mask).count("1") > cap:
                continue
            keep = frozenset(pool[i] for i in range(n) if mask >> i & 1)
            top = max(top, best(t + 1, keep))
        return hit + top

    return best(0, frozenset())


@pytest.mark.parametrize("seed", range(40))
def test_belady_equals_brute_force(seed: int) -> None:
    trace = random_trace(seed, n=random.Random(seed).randint(3, 6))
    keys = keys_of(trace)
    distinct = {k for req in keys for k in req}
    if len(distinct) > 9:
        pytest.skip("too many pages for brute force")
    for cap in range(0, 5):
        assert belady(keys, cap).total_hit_pages == brute_force(trace, cap), (trace, cap)


@pytest.mark.parametrize("seed", range(10))
def test_belady_stays_prefix_closed_and_bounded(seed: int) -> None:
    """Evicting farthest-next-use, deepest first never leaves a cached page without its
    parent; hits never exceed infinite capacity and grow with capacity."""
    trace = random_trace(seed, n=60)
    keys = keys_of(trace)
    ideal = belady(keys, 10**9).total_hit_pages
    prev = -1
    for cap in (0, 1, 2, 4, 8, 16, 64):
        res = belady(keys, cap)
        assert res.total_hit_pages <= ideal
        assert res.total_hit_pages >= prev
        prev = res.total_hit_pages
    assert prev == ideal


def test_belady_beats_lru_replay_through_the_real_cache() -> None:
    """At equal capacity, Belady keeps at least what the radix tree under every policy keeps."""
    trace = random_trace(11, n=200)
    vocab = {}
    toks = []
    for req in trace:
        toks.append([vocab.setdefault(p, len(vocab)) * 4 + i for p in req for i in range(4)])
    keys = [page_keys(np.array(t, dtype=np.int64), 4) for t in toks]
    for cap_pages in (3, 6, 12):
        opt = belady(keys, cap_pages)
        for policy in ("lru", "lfu", "fifo", "mru"):
            cache = RadixCache(page_size=4, policy=policy)
            hits, slot = 0, 0
            for t in toks:
                hits += cache.match(t).length // 4
                cache.insert(t, list(range(slot, slot + len(t))))
                slot += len(t)
                if cache.total_size > 4 * cap_pages:
                    cache.evict(cache.total_size - 4 * cap_pages)
            assert opt.total_hit_pages >= hits, (policy, cap_pages)


def test_page_keys_chain_the_prefix_and_the_namespace() -> None:
    a = page_keys([1, 2, 3, 4, 5], 2)
    b = page_keys([1, 2, 3, 9, 5], 2)
    assert len(a) == 2 and a[0] == b[0] and a[1] != b[1]
    assert page_keys([7, 3, 4], 2)[0] != a[0]
    assert page_keys([1, 2], 2, namespace="x") != page_keys([1, 2], 2)
    assert page_keys([3, 4], 1)[1] != page_keys([9, 4], 1)[1]  # the key carries the prefix


def test_next_uses() -> None:
    assert next_uses([["a", "b"], ["a"], ["b"]]) == [[1, 2], [NEVER], [NEVER]]

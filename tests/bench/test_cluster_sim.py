"""The offline cluster simulator (`radixkv.bench.cluster.cluster_sim`) on small hand-computed cases,
and its one-unbounded-pool result against the workloads' independent ideal-hit reference."""

from __future__ import annotations

import numpy as np
import pytest

from radixkv.bench.cluster.cluster_report import SimSetup, parse_config, simulate_all
from radixkv.bench.cluster.cluster_sim import PageIds, PageLRU, simulate, simulate_pool
from radixkv.bench.inputs.workloads import ideal_hits

A, B, C = [1, 2], [3, 4], [5, 6]


def test_page_ids_name_whole_prefixes() -> None:
    ids = PageIds()
    first = ids.chain([7, 8, 9, 10, 11], 2)  # two full pages; the fifth token is not a page
    assert len(first) == 2
    assert ids.chain([7, 8, 9, 10], 2) == first
    # The same second page after a different first page is a different prefix.
    other = ids.chain([0, 8, 9, 10], 2)
    assert other[1] != first[1] and other[0] != first[0]
    assert ids.chain([7], 2) == []


def test_lru_evicts_leaves_first() -> None:
    lru = PageLRU(3)
    lru.touch([10, 11, 12])  # a chain: 10 is the root
    lru.touch([10, 13])  # 4 pages > 3: the least recent is the leaf 12, not the root 10
    assert lru.match([10, 11, 12]) == 2
    assert lru.match([10, 13]) == 2
    assert lru.match([11], 0) == 1 and lru.match([10, 11, 12], 2) == 0
    assert len(lru) == 3


def test_round_robin_by_hand() -> None:
    # Alternating tenants land on the same replicas under round robin...
    res = simulate([A, B, A, B], replicas=2, capacity_pages=2, page_size=1)
    assert (res.cached_tokens, res.prompt_tokens) == (4, 8)
    assert res.replica_requests == [2, 2] and res.replica_cached_tokens == [2, 2]
    # ... repeated tenants do not.
    res = simulate([A, A, B, B], replicas=2, capacity_pages=2, page_size=1)
    assert res.cached_tokens == 0


def test_cache_aware_by_hand() -> None:
    res = simulate([A, A, B, B], replicas=2, capacity_pages=2, page_size=1, route="cache_aware")
    assert res.cached_tokens == 4 and res.replica_requests == [2, 2]
    # A rate at or below the threshold goes to the smallest tree: [1, 9] matches A's tree 50%.
    res = simulate(
        [A, [1, 9]], replicas=2, capacity_pages=4, page_size=1, route="cache_aware",
        cache_threshold=0.5,
    )  # fmt: skip
    assert res.replica_requests == [1, 1] and res.cached_tokens == 0
    res = simulate([A, [1, 9]], replicas=2, capacity_pages=4, page_size=1, route="cache_aware")
    assert res.replica_requests == [2, 0] and res.cached_tokens == 1


def test_kv_aware_sees_evictions_the_text_tree_does_not() -> None:
    prompts = [A, B, A, C, A]
    # cache_aware: A->0, B->1, A->0 (hit 2), C->0 (equal tree sizes: the first) evicting A, then
    # A->0 again by its stale tree: a miss.
    text = simulate(prompts, replicas=2, capacity_pages=2, page_size=1, route="cache_aware")
    assert text.cached_tokens == 2
    # kv_aware: C has no match: to the replica with fewer requests (1), evicting B; A -> 0 hits.
    exact = simulate(prompts, replicas=2, capacity_pages=2, page_size=1, route="kv_aware")
    assert exact.cached_tokens == 4 and exact.replica_requests == [3, 2]


def test_shared_l3_and_in_flight() -> None:
    alone = simulate([A, A], replicas=2, capacity_pages=2, page_size=1)
    assert alone.cached_tokens == 0
    shared = simulate([A, A], replicas=2, capacity_pages=2, page_size=1, shared_l3=True)
    assert shared.cached_tokens == 2 and shared.l3_cached_tokens == 2
    # Part local, part L3: replica 0 keeps the root page [1] only (capacity 1, leaf evicted
    # first); the L3 holds [1, 2] too.
    part = simulate([A, B, A], replicas=2, capacity_pages=1, page_size=1, shared_l3=True)
    assert part.cached_tokens == 2 and part.l3_cached_tokens == 1
    # A bounded L3 of 2 pages forgets A once B is written.
    bounded = simulate(
        [A, B, A], replicas=2, capacity_pages=0, page_size=1, shared_l3=True, l3_capacity_pages=2
    )
    assert bounded.cached_tokens == 0
    # Concurrent requests do not see each other's pages.
    assert simulate_pool([A, A], capacity_pages=None, page_size=1, in_flight=1).cached_tokens == 0
    assert (
        simulate_pool([A, A, A], capacity_pages=None, page_size=1, in_flight=1).cached_tokens == 2
    )


def test_global_pool_beats_split_pools() -> None:
    tenants = [[t * 100 + k for k in range(8)] for t in range(6)]
    order = [tenants[i % 6] for i in range(36)]
    split = simulate(order, replicas=3, capacity_pages=8, page_size=2)  # 2 tenants per replica
    one = simulate_pool(order, capacity_pages=24, page_size=2)
    # Round robin over 3 replicas with tenants cycling 0..5: replica r sees tenants r and r+3 only,
    # which fit; so both hit everything after the first round of 6.
    assert split.cached_tokens == one.cached_tokens == 30 * 8
    # 4 tenants cycling over 3 replicas: each replica sees all 4 in turn and holds 2 (LRU: no
    # hit at all); one pool of the summed capacity (6 tenants) hits all after the first 4.
    four = [tenants[i % 4] for i in range(24)]
    assert simulate(four, replicas=3, capacity_pages=8, page_size=2).cached_tokens == 0
    assert simulate_pool(four, capacity_pages=24, page_size=2).cached_tokens == 20 * 8
    exact = simulate(four, replicas=3, capacity_pages=8, page_size=2, route="kv_aware")
    assert exact.cached_tokens == 20 * 8


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_unbounded_pool_equals_page_floored_ideal(page_size: int) -> None:
    rng = np.random.default_rng(page_size)
    stems = [rng.integers(0, 50, size=int(rng.integers(1, 80))).tolist() for _ in range(10)]
    prompts = []
    for _ in range(200):
        stem = stems[int(rng.integers(0, len(stems)))]
        cut = int(rng.integers(0, len(stem) + 1))
        prompts.append(stem[:cut] + rng.integers(0, 50, size=int(rng.integers(1, 30))).tolist())
    res = simulate_pool(prompts, capacity_pages=None, page_size=page_size)
    expected = sum(h // page_size * page_size for h in ideal_hits(prompts))
    assert res.cached_tokens == expected
    assert res.prompt_tokens == sum(map(len, prompts))


def test_configuration_names() -> None:
    assert parse_config("round_robin") == ("smg", "round_robin", False, False)
    assert parse_config("cache_aware+l3") == ("smg", "cache_aware", True, False)
    assert parse_config("kv_aware") == ("vllm-router", "kv_aware", False, False)
    assert parse_config("kv_aware+l2") == ("vllm-router", "kv_aware", False, True)
    assert parse_config("cache_aware+l2+l3") == ("smg", "cache_aware", True, True)
    assert parse_config("one_pool") == ("none", "none", False, False)
    for bad in ("kv_aware+l4", "random", "one_pool+l3", "kv_aware+l2+l2"):
        with pytest.raises(ValueError):
            parse_config(bad)
    # +l2 is simulated as replicas of twice the pool (the L2 holds 2x, written through).
    tenants = [[t * 10 + k for k in range(4)] for t in range(4)] * 2
    two = simulate_all(tenants, SimSetup(1, 8, 1, 0), ["round_robin", "round_robin+l2"])
    assert two["round_robin"].cached_tokens == 0  # 16 pages of tenants cycle through 8
    assert two["round_robin+l2"].cached_tokens == 16  # all four fit in 16
    # one_pool is simulated as the global pool: one LRU of the summed capacity.
    prompts = [[t * 10 + k for k in range(4)] for t in range(3)] * 2
    sims = simulate_all(prompts, SimSetup(3, 4, 1, 0), ["round_robin", "one_pool"])
    assert sims["one_pool"].cached_tokens == sims["global pool"].cached_tokens == 12
    assert sims["round_robin"].cached_tokens == 12  # tenant t always lands on replica t
    assert sims["ideal"].cached_tokens == 12

"""Eviction order per policy on hand-built trees, for both cache designs where they apply."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from radixkv.cache import (
    BlockHashCache,
    RadixCache,
    available_policies,
    make_cache,
    make_policy,
)
from radixkv.cache.policies import CORE_POLICIES, RESEARCH_POLICIES
from radixkv.cache.policies.core import LRUPolicy

TRUNK = list(range(1000, 1016))  # a shared system prompt ("refund policy ...")


def seq(first: int, n: int = 4) -> list[int]:
    return [first + i for i in range(n)]


def slots_for(toks: list[int], base: int) -> np.ndarray:
    return np.arange(base, base + len(toks), dtype=np.int64)


def evict_order(cache: Any, slot_owner: dict[int, str]) -> list[str]:
    """Evict one page at a time (a page-granular cache frees a leaf tail first); name each run
    of evictions by the owner of its slots (slot bases are multiples of 100)."""
    order: list[str] = []
    while cache.evictable_size:
        out = cache.evict(1)
        name = slot_owner[int(out[0]) // 100 * 100]
        if not order or order[-1] != name:
            order.append(name)
    return order


def build_three(cache: Any) -> dict[int, str]:
    """Three unrelated 4-token sequences X, Y, Z inserted in that order."""
    owner = {}
    for name, first, base in (("X", 10, 100), ("Y", 20, 200), ("Z", 30, 300)):
        cache.insert(seq(first), slots_for(seq(first), base))
        owner[base] = name
    return owner


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("lru", ["Y", "Z", "X"]),  # X was matched last
        ("mru", ["X", "Z", "Y"]),
        ("fifo", ["X", "Y", "Z"]),  # insertion order, use ignored
    ],
)
def test_recency_policies(policy: str, expected: list[str]) -> None:
    cache = RadixCache(policy=policy)
    owner = build_three(cache)
    assert cache.match(seq(10)).length == 4
    assert evict_order(cache, owner) == expected
    cache.check_integrity()


def test_lfu_counts_hits_then_recency() -> None:
    cache = RadixCache(policy="lfu")
    owner = build_three(cache)
    for _ in range(2):
        cache.match(seq(20))
    cache.match(seq(10))
    cache.match(seq(30))  # X and Z tie on hits; X is less recent
    assert evict_order(cache, owner) == ["X", "Z", "Y"]


def test_priority_lowest_first_ties_by_recency() -> None:
    cache = RadixCache(policy="priority")
    owner = {}
    for name, first, base, prio in (("X", 10, 100, 2), ("Y", 20, 200, 0), ("Z", 30, 300, 0)):
        cache.insert(seq(first), slots_for(seq(first), base), priority=prio)
        owner[base] = name
    cache.match(seq(20))  # Y and Z tie on priority; Z is now less recent
    assert evict_order(cache, owner) == ["Z", "Y", "X"]


def test_priority_is_never_lowered_by_a_later_insert() -> None:
    cache = RadixCache(policy="priority")
    cache.insert(seq(10), slots_for(seq(10), 100), priority=5)
    cache.insert(seq(20), slots_for(seq(20), 200), priority=1)
    cache.insert(seq(10), slots_for(seq(10), 900), priority=0)  # same prefix, lower priority
    assert cache.evict(4).tolist() == [200, 201, 202, 203]


def test_peek_does_not_change_order_or_stats() -> None:
    cache = RadixCache(policy="lru")
    owner = build_three(cache)
    before = cache.stats()
    assert cache.match(seq(10), record=False).length == 4
    assert cache.stats() == before
    assert evict_order(cache, owner) == ["X", "Y", "Z"]


@pytest.mark.parametrize("policy", available_policies())
@pytest.mark.parametrize("page", [1, 4, 16])
def test_trunk_survives_while_a_child_exists(policy: str, page: int) -> None:
    cache = RadixCache(page_size=page, policy=policy)
    a, b = [*TRUNK, *seq(1, 16)], [*TRUNK, *seq(50, 16)]
    cache.insert(a, slots_for(a, 0))
    cache.insert(b, slots_for(b, 100))
    cache.match(TRUNK)  # the trunk alone is now the most recent / most hit
    first = cache.evict(16)
    assert len(first) == 16 and first[0] not in range(16)  # a child, never the trunk
    cache.check_integrity()
    second = cache.evict(16)
    assert len(second) == 16 and second[0] not in range(16)
    assert cache.evict(16).tolist() == list(range(16))  # the trunk goes only after both
    assert cache.total_size == 0


@pytest.mark.parametrize("policy", available_policies())
def test_locked_path_is_never_evicted(policy: str) -> None:
    cache = RadixCache(page_size=4, policy=policy)
    a, b = [*TRUNK, *seq(1, 8)], [*TRUNK, *seq(50, 8)]
    cache.insert(a, slots_for(a, 0))
    cache.insert(b, slots_for(b, 100))
    handle = cache.match([*a, 99]).handle
    cache.lock(handle)
    cache.lock(handle)
    assert cache.protected_size == len(a)
    freed = cache.evict(10_000)
    assert sorted(freed.tolist()) == list(range(116, 124))  # only b's own tail
    assert cache.total_size == len(a) and cache.evictable_size == 0
    cache.unlock(handle)
    assert cache.evict(10_000).size == 0  # still locked once
    cache.unlock(handle)
    assert sorted(cache.evict(10_000).tolist()) == list(range(24))
    with pytest.raises(ValueError):
        cache.lock(handle)  # evicted: the handle is stale


def test_evict_stops_once_enough_is_freed() -> None:
    cache = RadixCache()
    build_three(cache)
    # Page-granular: the oldest leaf whole, then only the tail page of the next one.
    assert cache.evict(5).tolist() == [100, 101, 102, 103, 203]
    assert cache.total_size == 7
    assert len(cache.evict(0)) == 0
    cache.check_integrity()
    assert cache.match(seq(20)).length == 3  # the trimmed head stays cached


@pytest.mark.parametrize("page", [1, 4])
def test_trim_keeps_head_policy_fields_and_kills_the_tail_handle(page: int) -> None:
    cache = RadixCache(page_size=page, policy="lfu")
    toks = seq(10, 4 * page)
    cache.insert(toks, slots_for(toks, 100))
    res = cache.match(toks)
    assert cache.evict(page).tolist() == list(range(100 + 3 * page, 100 + 4 * page))
    with pytest.raises(ValueError):
        cache.lock(res.handle)  # the handle's node lost its tail: it is stale
    head = cache.match(toks, record=False)
    assert head.length == 3 * page and head.handle.hits == 2
    cache.check_integrity()


def test_blockhash_lru_and_locks() -> None:
    cache = BlockHashCache(page_size=4)
    owner = build_three(cache)
    cache.match(seq(10))
    assert evict_order(cache, owner) == ["Y", "Z", "X"]
    a = [*TRUNK, *seq(1, 8)]
    cache.insert(a, slots_for(a, 0))
    res = cache.match(a[:20])
    cache.lock(res.handle)
    assert cache.protected_size == 20
    assert sorted(cache.evict(100).tolist()) == list(range(20, 24))  # deepest unlocked block
    cache.unlock(res.handle)
    assert [int(s) for s in cache.evict(4)] == list(range(16, 20))  # leaves go first
    cache.check_integrity()


def test_blockhash_rejects_other_policies() -> None:
    with pytest.raises(ValueError, match="lru"):
        BlockHashCache(policy="lfu")


def test_factory_and_unknown_names() -> None:
    assert isinstance(make_cache("radix", 4, "fifo"), RadixCache)
    assert isinstance(make_cache("blockhash", 16, "lru"), BlockHashCache)
    with pytest.raises(ValueError):
        make_cache("trie", 1, "lru")
    with pytest.raises(ValueError):
        RadixCache(policy="random")


# The names users pass (--eviction-policy, replay --policy); renaming one breaks their commands.
PUBLIC_NAMES = [
    "density",
    "fifo",
    "lfu",
    "lru",
    "mru",
    "predict",
    "priority",
    "s3fifo",
    "session-lru",
]


def test_public_names_split_into_core_and_research() -> None:
    assert available_policies() == PUBLIC_NAMES
    assert set(CORE_POLICIES) == {"lru", "mru", "lfu", "fifo", "priority", "session-lru"}
    assert set(RESEARCH_POLICIES) == {"s3fifo", "predict", "density"}
    for name in PUBLIC_NAMES:
        assert make_policy(name).name == name
    assert make_policy("session-lfu").name == "session-lfu"  # any classic base, on demand


@pytest.mark.parametrize(
    "first",
    [
        "radixkv.cache.leafqueue",
        "radixkv.cache.policies.research.segmented",
        "radixkv.cache.policies.research.density",
        "radixkv.cache.policies.research.regret",
        "radixkv.cache.policies.core",
        "radixkv.config.sections",
    ],
)
def test_registry_does_not_depend_on_import_order(first: str) -> None:
    """Whichever module a fresh process imports first, every name resolves (the registry lives in
    the package `__init__`, and no policy module imports it back)."""
    code = (
        f"import {first}\n"
        "from radixkv.cache.policies import available_policies, make_policy\n"
        "print(sorted(make_policy(n).name for n in available_policies()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(PUBLIC_NAMES)


def test_research_policies_load_only_when_named() -> None:
    """Importing the cache, the scheduler or the engine, or building the command line (whose
    --eviction-policy choices list every policy and its session form), loads nothing of
    `policies/research/` (the regret window's type is only the type checker's); naming a research
    policy loads its module, and only that one."""
    research = "radixkv.cache.policies.research"
    code = (
        "import sys\n"
        "import radixkv.cache, radixkv.engine.scheduler, radixkv.engine.stats\n"
        "import radixkv.engine.setup, radixkv.engine.engine\n"
        "from radixkv.cli import build_parser\n"
        "build_parser()\n"
        f"print(sorted(m for m in sys.modules if m.startswith({research!r})))\n"
        "from radixkv.cache import RadixCache\n"
        "RadixCache(policy='s3fifo')\n"
        f"print(sorted(m for m in sys.modules if m.startswith({research!r})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    before, after = out.stdout.strip().splitlines()
    assert before == "[]"
    assert after == str([research, f"{research}.segmented"])


@pytest.mark.parametrize("policy", ["lru", "mru"])
def test_stale_heap_entries_stay_bounded(policy: str) -> None:
    """Lock/unlock churn (and, for mru, every hit) leaves stale heap entries; compaction keeps
    them at most about the live count, and order survives it."""
    cache = RadixCache(policy=policy)
    owner = build_three(cache)
    for _ in range(500):
        res = cache.match(seq(20))
        cache.lock(res.handle)
        cache.unlock(res.handle)
        assert len(cache._leaves._heap) <= 2 * len(cache._leaves) + 65
    cache.check_integrity()
    expected = ["X", "Z", "Y"] if policy == "lru" else ["Y", "Z", "X"]
    assert evict_order(cache, owner) == expected


class CountingLRU(LRUPolicy):
    calls = 0

    def key(self, node: Any) -> tuple[int, int]:
        CountingLRU.calls += 1
        return super().key(node)


def test_evict_is_incremental_not_a_scan() -> None:
    """Evicting one leaf from a 4,000-leaf tree looks at O(1) heap entries (no scan, no rebuild)."""
    cache = RadixCache(page_size=2, policy=CountingLRU())
    rng = np.random.default_rng(0)
    for i in range(4000):
        toks = [*TRUNK, *rng.integers(0, 1 << 30, 6).tolist()]
        cache.insert(toks, slots_for(toks, 100 * i))
    for toks in (TRUNK,):
        cache.match(toks)
    CountingLRU.calls = 0
    for _ in range(100):
        assert len(cache.evict(6)) == 6
    assert CountingLRU.calls <= 100 * 2
    cache.check_integrity()

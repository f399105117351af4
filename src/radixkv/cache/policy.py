"""Eviction policies: how evictable leaves are ordered.

A policy maps a node's bookkeeping (logical access time, hit count, creation time, priority) to a
sort key; the cache evicts the leaf with the SMALLEST key first. Times come from a logical clock
owned by the cache (one tick per recorded match or insert), never from wall time, so every run is
deterministic.

`monotone` declares that a node's key never decreases when the node is accessed again. The cache
uses it to skip heap work on every hit: a monotone policy leaves the (now too small) heap entry in
place and re-keys it lazily when it reaches the top of the heap. Non-monotone policies (mru) get a
fresh heap entry on every access instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

PolicyKey = tuple[int, int]


class PolicyNode(Protocol):
    """The per-node fields a policy may read (both cache designs provide them)."""

    last_access: int
    hits: int
    created: int
    priority: int


class EvictionPolicy:
    """Base class: `key(node)` orders eviction (smallest first)."""

    name: str = ""
    monotone: bool = True

    def key(self, node: PolicyNode) -> PolicyKey:
        raise NotImplementedError


class LRUPolicy(EvictionPolicy):
    """Least recently used first."""

    name = "lru"

    def key(self, node: PolicyNode) -> PolicyKey:
        return (node.last_access, 0)


class MRUPolicy(EvictionPolicy):
    """Most recently used first (useful for scans that never repeat)."""

    name = "mru"
    monotone = False  # an access makes the key smaller

    def key(self, node: PolicyNode) -> PolicyKey:
        return (-node.last_access, 0)


class LFUPolicy(EvictionPolicy):
    """Fewest hits first; ties broken by least recent access."""

    name = "lfu"

    def key(self, node: PolicyNode) -> PolicyKey:
        return (node.hits, node.last_access)


class FIFOPolicy(EvictionPolicy):
    """Oldest insertion first, regardless of use."""

    name = "fifo"

    def key(self, node: PolicyNode) -> PolicyKey:
        return (node.created, 0)


class PriorityPolicy(EvictionPolicy):
    """Lowest priority first (a node keeps the highest priority inserted through it); ties
    by least recent access."""

    name = "priority"

    def key(self, node: PolicyNode) -> PolicyKey:
        return (node.priority, node.last_access)


_REGISTRY: dict[str, Callable[[], EvictionPolicy]] = {
    "lru": LRUPolicy,
    "mru": MRUPolicy,
    "lfu": LFUPolicy,
    "fifo": FIFOPolicy,
    "priority": PriorityPolicy,
}


def register_policy(name: str, factory: Callable[[], EvictionPolicy]) -> None:
    """Make a custom policy available by name to every cache constructor."""
    _REGISTRY[name] = factory


def available_policies() -> list[str]:
    return sorted(_REGISTRY)


def make_policy(policy: str | EvictionPolicy) -> EvictionPolicy:
    """Resolve a policy name (or pass an instance through); unknown names are a ValueError."""
    if isinstance(policy, EvictionPolicy):
        return policy
    try:
        return _REGISTRY[policy]()
    except KeyError:
        raise ValueError(
            f"unknown eviction policy {policy!r}; choose one of {available_policies()}"
        ) from None

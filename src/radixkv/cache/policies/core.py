"""The classic eviction policies: lru (the default), mru, lfu, fifo, priority, and the
session-aware form of any of them (`session-<base>`). Each only orders the evictable leaves by a
key over the node's fields; none owns its queue.
"""

from __future__ import annotations

from typing import Any

from radixkv.cache.leafqueue import LeafQueue
from radixkv.cache.policies.base import EvictionPolicy, PolicyKey, PolicyNode


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


class SessionAwarePolicy(EvictionPolicy):
    """SGLang-style session awareness over any base policy: leaves no session references
    (`node.sref == 0`) go first, then fewer references, then the base policy's order."""

    def __init__(self, base: EvictionPolicy) -> None:
        self.base = base
        self.name = f"session-{base.name}"
        self.monotone = base.monotone  # sref only falls on release, which re-keys at once

    def key(self, node: PolicyNode) -> PolicyKey:
        return (node.sref, *self.base.key(node))  # type: ignore[attr-defined]

    def bind(self, cache: Any) -> None:
        self.base.bind(cache)

    def on_evict(self, node: Any) -> None:
        self.base.on_evict(node)

    def on_insert(self, node: Any) -> None:
        self.base.on_insert(node)

    def on_match(self, path: list[Any], clock: int) -> None:
        self.base.on_match(path, clock)

    def on_reset(self) -> None:
        self.base.on_reset()

    def make_queue(self) -> LeafQueue:
        if type(self.base).make_queue is not EvictionPolicy.make_queue:
            raise ValueError(f"{self.base.name} owns its queue; it has no session-aware form")
        return super().make_queue()

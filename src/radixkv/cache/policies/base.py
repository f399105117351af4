"""The eviction-policy contract: how evictable leaves are ordered.

A policy maps a node's bookkeeping (logical access time, hit count, creation time, priority,
session references, depth) to a sort key (a tuple of ints); the cache evicts the leaf with the
SMALLEST key first, tail pages first when less than the whole leaf is needed. Times come from a
logical clock owned by the cache (one tick per recorded match or insert), never from wall time, so
every run is deterministic.

`monotone` declares that a node's key never decreases when the node is accessed again. The cache
uses it to skip heap work on every hit: a monotone policy leaves the (now too small) heap entry in
place and re-keys it lazily when it reaches the top of the heap. Non-monotone policies (mru) get a
fresh heap entry on every access instead.

Beyond the key, a policy may own its queue of evictable leaves (`make_queue`, e.g. segmented
queues with their own size targets), see the cache it serves (`bind`), and hear about every node
that is evicted (`on_evict`, e.g. to remember ghosts) or dropped by a reset (`on_reset`). Every
hook is O(1) or O(log n) per leaf, or O(pages) of the tokens it is told about.

Policy modules import this one (never the package `__init__`, which registers them).
"""

from __future__ import annotations

from typing import Any, Protocol

from radixkv.cache.leafqueue import LeafQueue

PolicyKey = tuple[int, ...]


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

    def bind(self, cache: Any) -> None:
        """Called once by the cache that uses this policy (a policy serves one cache)."""

    def make_queue(self) -> LeafQueue:
        """The queue of evictable leaves; the default is one heap ordered by `key`."""
        return LeafQueue(self)

    def on_evict(self, node: Any) -> None:
        """`node` (no longer in the tree) was just evicted."""

    def on_insert(self, node: Any) -> None:
        """`node` is a new leaf, about to be tracked (it may adjust its policy fields)."""

    def on_match(self, path: list[Any], clock: int) -> None:
        """A recorded match of `path` at tick `clock`, before the path's fields are updated."""

    def on_reset(self) -> None:
        """The cache dropped every node (`reset`); no `on_evict` is heard for them."""

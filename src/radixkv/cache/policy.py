"""Eviction policies: how evictable leaves are ordered.

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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
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
        from radixkv.cache.leafqueue import LeafQueue

        return LeafQueue(self)

    def on_evict(self, node: Any) -> None:
        """`node` (no longer in the tree) was just evicted."""

    def on_insert(self, node: Any) -> None:
        """`node` is a new leaf, about to be tracked (it may adjust its policy fields)."""

    def on_match(self, path: list[Any], clock: int) -> None:
        """A recorded match of `path` at tick `clock`, before the path's fields are updated."""

    def on_reset(self) -> None:
        """The cache dropped every node (`reset`); no `on_evict` is heard for them."""


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


_REGISTRY: dict[str, Callable[[], EvictionPolicy]] = {
    "lru": LRUPolicy,
    "mru": MRUPolicy,
    "lfu": LFUPolicy,
    "fifo": FIFOPolicy,
    "priority": PriorityPolicy,
    "session-lru": lambda: SessionAwarePolicy(LRUPolicy()),
}


def _register_online() -> None:
    """Policies in their own modules (imported lazily: they import this one)."""
    from radixkv.cache.density import DensityPolicy
    from radixkv.cache.predictive import PredictivePolicy
    from radixkv.cache.segmented import S3FIFOPolicy

    _REGISTRY["s3fifo"] = S3FIFOPolicy
    _REGISTRY["predict"] = PredictivePolicy
    _REGISTRY["density"] = DensityPolicy


_register_online()


def register_policy(name: str, factory: Callable[[], EvictionPolicy]) -> None:
    """Make a custom policy available by name to every cache constructor."""
    _REGISTRY[name] = factory


def available_policies() -> list[str]:
    return sorted(_REGISTRY)


def make_policy(policy: str | EvictionPolicy) -> EvictionPolicy:
    """Resolve a policy name (or pass an instance through); unknown names are a ValueError."""
    if isinstance(policy, EvictionPolicy):
        return policy
    if policy.startswith("session-") and policy not in _REGISTRY:
        base = policy.removeprefix("session-")
        if base in _REGISTRY and not base.startswith("session-"):
            return SessionAwarePolicy(_REGISTRY[base]())
    try:
        return _REGISTRY[policy]()
    except KeyError:
        raise ValueError(
            f"unknown eviction policy {policy!r}; choose one of {available_policies()}"
        ) from None

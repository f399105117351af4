"""S3-FIFO-style segmented eviction on the radix tree (probation / main, with ghosts).

New entries are on probation: a leaf that was never hit since it was inserted (`hits == 1`)
lives in the probation queue (FIFO: oldest insert first); a leaf hit at least once lives in the
main queue (LRU). Eviction takes from probation while probation holds more than `small` of the
cached tokens, else from main, so one-hit wonders (the final turn of a conversation, a one-off
document) leave quickly without flushing what proved reusable, and a burst of new requests can
not evict more than probation's share... until main itself is the oldest.

Ghosts: a probation leaf that is evicted leaves a ghost (its depth and first page, hashed) in a
bounded FIFO; when the same page is inserted again while its ghost is remembered, the new node
counts as already reused (it goes to main): it was needed again soon after probation dropped it.

Every operation is O(log n) per leaf (two heaps with lazy invalidation, a dict and a deque for
ghosts). The queue interface is LeafQueue's.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from radixkv.cache.keys import TOKEN_BYTES
from radixkv.cache.leafqueue import LeafQueue
from radixkv.cache.policies.base import EvictionPolicy, PolicyKey, PolicyNode


class _SegmentKey(EvictionPolicy):
    """The key inside one segment: FIFO by creation (probation) or LRU (main)."""

    def __init__(self, main: bool) -> None:
        self.main = main
        self.name = "main" if main else "probation"

    def key(self, node: PolicyNode) -> PolicyKey:
        return (node.last_access,) if self.main else (node.created,)


class SegmentedQueue:
    """Two leaf queues; a node is in the one its policy's `segment(node)` names."""

    def __init__(self, policy: S3FIFOPolicy) -> None:
        self.policy = policy
        self.keys = (_SegmentKey(False), _SegmentKey(True))
        self.queues = (LeafQueue(self.keys[0]), LeafQueue(self.keys[1]))
        self.tokens = [0, 0]  # tokens of the leaves in each queue, as counted when pushed
        self._where: dict[int, tuple[int, int]] = {}  # id(node) -> (segment, tokens counted)

    def __len__(self) -> int:
        return len(self.queues[0]) + len(self.queues[1])

    def push(self, node: Any) -> None:
        seg = self.policy.segment(node)
        self.queues[seg].push(node)
        self._where[id(node)] = (seg, node.ntok)
        self.tokens[seg] += node.ntok

    def _forget(self, node: Any) -> int:
        seg, tok = self._where.pop(id(node))
        self.tokens[seg] -= tok
        return seg

    def invalidate(self, node: Any) -> None:
        seg = self._forget(node)
        self.queues[seg].invalidate(node)

    def touched(self, node: Any) -> None:
        seg = self._where[id(node)][0]
        if self.policy.segment(node) != seg:  # probation -> main on its first hit
            self.invalidate(node)
            self.push(node)
        else:
            self.queues[seg].touched(node)

    def pop(self) -> Any:
        total = self.tokens[0] + self.tokens[1]
        first = 0 if self.tokens[0] > self.policy.small * total else 1
        for seg in (first, 1 - first):
            node = self.queues[seg].pop()
            if node is not None:
                self._forget(node)
                self.policy.last_segment = seg  # read by on_evict for the node just popped
                return node
        return None

    def clear(self) -> None:
        for q in self.queues:
            q.clear()
        self.tokens = [0, 0]
        self._where.clear()

    def tracked(self) -> list[Any]:
        out = self.queues[0].tracked() + self.queues[1].tracked()
        if {id(n) for n in out} != set(self._where):
            raise AssertionError("segmented queue: membership map disagrees with the heaps")
        for seg, q in enumerate(self.queues):
            if any(self._where[id(n)][0] != seg for n in q.tracked()):
                raise AssertionError("segmented queue: a node sits in the wrong segment")
        return out

    def check(self, policy: EvictionPolicy) -> None:
        for q, key in zip(self.queues, self.keys, strict=True):
            q.check(key)
        for n in self.queues[0].tracked():
            if self.policy.segment(n) != 0:
                raise AssertionError("segmented queue: a reused leaf is still on probation")


class S3FIFOPolicy(EvictionPolicy):
    """Probation (FIFO, `small` of the cache) + main (LRU) + ghosts; see the module docstring.
    `key` (for checks and tools) orders probation before main, each by its own clock."""

    name = "s3fifo"

    def __init__(self, small: float = 0.1, ghosts: bool = True) -> None:
        self.small = small
        self.ghosts = ghosts
        self._ghost: OrderedDict[tuple[int, int], None] = OrderedDict()
        self._cache: Any = None
        self.last_segment = 1

    def segment(self, node: Any) -> int:
        return 0 if node.hits <= 1 else 1

    def key(self, node: PolicyNode) -> PolicyKey:
        if self.segment(node) == 0:
            return (0, node.created)
        return (1, node.last_access)

    def bind(self, cache: Any) -> None:
        self._cache = cache

    def make_queue(self) -> Any:
        return SegmentedQueue(self)

    def _ghost_key(self, node: Any) -> tuple[int, int]:
        pb = self._cache.page_size * TOKEN_BYTES
        return (node.depth, hash(node.key[:pb]))

    def on_evict(self, node: Any) -> None:
        if not self.ghosts or self.last_segment != 0 or self._cache is None:
            return
        ghost = self._ghost
        ghost[self._ghost_key(node)] = None
        limit = max(self._cache.total_size // self._cache.page_size, 1024)
        while len(ghost) > limit:
            ghost.popitem(last=False)

    def on_insert(self, node: Any) -> None:
        """A new leaf whose first page was recently evicted from probation starts in main."""
        if self.ghosts and self._ghost and self._ghost.pop(self._ghost_key(node), 0) is None:
            node.hits = 2

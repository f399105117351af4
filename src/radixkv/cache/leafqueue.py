"""The incrementally maintained set of evictable leaves, ordered by an eviction policy.

A binary heap with lazy invalidation. Each tracked node holds its live heap entry in `node.entry`;
an entry whose node no longer points back at it is stale and is skipped when popped.

Invariants:
- a node is tracked (``node.entry is not None``) iff the cache considers it an evictable leaf;
- ``stale`` counts exactly the heap entries that are not some node's live entry;
- stale entries never outnumber live ones by more than a constant: `invalidate` compacts the heap
  (O(n)) once stale entries exceed half of it, so every operation is O(log n) amortised and no
  call ever scans or rebuilds more than the entries invalidated since the last compaction paid for.

For a monotone policy (a node's key only grows with access) an access does not touch the heap: the
old entry's key is a lower bound of the node's true key, so when it reaches the top `pop` compares
it with the true key and, if they differ, re-inserts the node with its true key and carries on.
The entry popped with an up-to-date key is therefore the true minimum among tracked nodes.
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from radixkv.cache.policies import EvictionPolicy

# (policy key, insertion sequence number, node); the unique sequence number keeps tuple
# comparison from ever reaching the node.
Entry = tuple[tuple[int, ...], int, Any]


class TrackedNode(Protocol):
    """A node the queue can track: it holds its live entry and the fields policies read
    (`radixkv.cache.policies.PolicyNode`, restated here so that this module imports no policy
    at run time)."""

    entry: Entry | None
    last_access: int
    hits: int
    created: int
    priority: int


class LeafQueue:
    """Evictable leaves in policy order (smallest key first)."""

    __slots__ = ("_counter", "_heap", "_key", "_monotone", "live", "stale")

    def __init__(self, policy: EvictionPolicy) -> None:
        self._key = policy.key
        self._monotone = policy.monotone
        self._heap: list[Entry] = []
        self._counter = itertools.count()
        self.live = 0
        self.stale = 0

    def __len__(self) -> int:
        return self.live

    def push(self, node: TrackedNode) -> None:
        """Start tracking `node` (must not be tracked already)."""
        entry = (self._key(node), next(self._counter), node)
        node.entry = entry
        heapq.heappush(self._heap, entry)
        self.live += 1

    def invalidate(self, node: TrackedNode) -> None:
        """Stop tracking `node` (must be tracked)."""
        node.entry = None
        self.live -= 1
        self.stale += 1
        if self.stale > 64 and self.stale > self.live:
            self._compact()

    def touched(self, node: TrackedNode) -> None:
        """`node` (tracked) was accessed; only non-monotone policies need a new entry now."""
        if not self._monotone:
            self.invalidate(node)
            self.push(node)

    def pop(self) -> Any:
        """Remove and return the tracked node with the smallest key, or None if there is none."""
        heap = self._heap
        key = self._key
        while heap:
            entry = heapq.heappop(heap)
            node = entry[2]
            if node.entry is not entry:
                self.stale -= 1
                continue
            if self._monotone:
                k = key(node)
                if k != entry[0]:
                    fresh = (k, next(self._counter), node)
                    node.entry = fresh
                    heapq.heappush(heap, fresh)
                    continue
            node.entry = None
            self.live -= 1
            return node
        return None

    def clear(self) -> None:
        self._heap = []
        self.live = 0
        self.stale = 0

    def tracked(self) -> list[Any]:
        """Every tracked node (for integrity checks); raises if the counters disagree."""
        live = [e[2] for e in self._heap if e[2].entry is e]
        if len(live) != self.live or len(self._heap) - len(live) != self.stale:
            raise AssertionError(
                f"leaf queue counters wrong: live={self.live} stale={self.stale} but heap has "
                f"{len(live)} live and {len(self._heap) - len(live)} stale entries"
            )
        if len({id(n) for n in live}) != len(live):
            raise AssertionError("leaf queue tracks a node twice")
        return live

    def check(self, policy: EvictionPolicy) -> None:
        """Heap order holds, and every live entry's key is the node's true key (a lower bound of
        it for monotone policies, whose entries are re-keyed lazily)."""
        heap = self._heap
        for i in range(1, len(heap)):
            if heap[(i - 1) // 2][:2] > heap[i][:2]:
                raise AssertionError(f"leaf heap order broken at entry {i}")
        for entry in heap:
            node = entry[2]
            if node.entry is not entry:
                continue
            true_key = policy.key(node)
            if entry[0] > true_key or (not policy.monotone and entry[0] != true_key):
                raise AssertionError(
                    f"leaf entry key {entry[0]} is not a valid bound of the node's {true_key}"
                )

    def _compact(self) -> None:
        self._heap = [e for e in self._heap if e[2].entry is e]
        heapq.heapify(self._heap)
        self.stale = 0

"""Next-use prediction: Belady's rule with a guessed future (the `predict` policy).

Belady evicts the page used furthest in the future. An online cache does not know the future,
but a conversation (a path of the tree) is reused with a rhythm: the gap between a node's last
two uses predicts the next one. So every node remembers the gap it last saw, a new leaf inherits
its parent's (the previous turn of its conversation), and an evictable leaf's predicted next
use is `last_access + gap` (in the cache's logical clock; a leaf with no history gets the mean
gap seen so far). Eviction order:

1. leaves that are overdue (`now > last_access + slack * gap`: the conversation probably ended),
   the most overdue deadline first;
2. otherwise the leaf whose predicted next use is furthest (the Belady choice), tail pages
   first within a leaf like every policy.

`slack` is the only parameter; it was chosen on the Claude Code traces (never on the Mooncake
traces the policy is evaluated on). O(log n) per leaf: two heaps with lazy invalidation.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any

from radixkv.cache.policies.base import EvictionPolicy, PolicyKey, PolicyNode

# Heap entries: (sort key, sequence number, node); a node's `entry` is the pair of its live
# entries (far, due), so an entry is live iff its node points back at it.
_Entry = tuple[int, int, Any]


class PredictQueue:
    """Evictable leaves ordered for `PredictivePolicy` (LeafQueue's interface)."""

    def __init__(self, policy: PredictivePolicy) -> None:
        self.policy = policy
        self._far: list[_Entry] = []  # (-predicted next use, ...)
        self._due: list[_Entry] = []  # (deadline, ...)
        self._seq = itertools.count()
        self.live = 0
        self.stale = 0

    def __len__(self) -> int:
        return self.live

    def push(self, node: Any) -> None:
        if node.gap <= 0:  # no history: the mean gap now, fixed so the keys stay exact
            node.gap = self.policy.mean_gap()
        nxt, deadline = self.policy.predict(node)
        far = (-nxt, next(self._seq), node)
        due = (deadline, next(self._seq), node)
        node.entry = (far, due)
        heapq.heappush(self._far, far)
        heapq.heappush(self._due, due)
        self.live += 1

    def invalidate(self, node: Any) -> None:
        node.entry = None
        self.live -= 1
        self.stale += 2
        if self.stale > 128 and self.stale > 2 * self.live:
            self._compact()

    def touched(self, node: Any) -> None:
        self.invalidate(node)  # the prediction moved: both keys change
        self.push(node)

    def _top(self, heap: list[_Entry], which: int) -> _Entry | None:
        while heap:
            e = heap[0]
            ent = e[2].entry
            if ent is not None and ent[which] is e:
                return e
            heapq.heappop(heap)
            self.stale -= 1
        return None

    def pop(self) -> Any:
        due = self._top(self._due, 1)
        if due is None:
            return None
        if due[0] < self.policy.now():
            node = due[2]
        else:
            far = self._top(self._far, 0)
            assert far is not None
            node = far[2]
        node.entry = None
        self.live -= 1
        self.stale += 2  # both of its entries are dead now (popped lazily later)
        return node

    def clear(self) -> None:
        self._far, self._due = [], []
        self.live = self.stale = 0

    def tracked(self) -> list[Any]:
        live = [e[2] for e in self._far if e[2].entry is not None and e[2].entry[0] is e]
        dues = [e[2] for e in self._due if e[2].entry is not None and e[2].entry[1] is e]
        if len(live) != self.live or {id(n) for n in live} != {id(n) for n in dues}:
            raise AssertionError("predict queue: heaps and live count disagree")
        if len(self._far) + len(self._due) - 2 * self.live != self.stale:
            raise AssertionError("predict queue: stale count is wrong")
        return live

    def check(self, policy: EvictionPolicy) -> None:
        for heap in (self._far, self._due):
            for i in range(1, len(heap)):
                if heap[(i - 1) // 2][:2] > heap[i][:2]:
                    raise AssertionError("predict queue: heap order broken")
        for node in self.tracked():
            nxt, deadline = self.policy.predict(node)
            if node.entry[0][0] != -nxt or node.entry[1][0] != deadline:
                raise AssertionError("predict queue: a leaf's keys are out of date")

    def _compact(self) -> None:
        self._far = [e for e in self._far if e[2].entry is not None and e[2].entry[0] is e]
        self._due = [e for e in self._due if e[2].entry is not None and e[2].entry[1] is e]
        heapq.heapify(self._far)
        heapq.heapify(self._due)
        self.stale = 0


class PredictivePolicy(EvictionPolicy):
    """See the module docstring. `key` is the pair the queue orders by (for tools/tests)."""

    name = "predict"
    monotone = False

    def __init__(self, slack: float = 2.0) -> None:
        self.slack = slack
        self._cache: Any = None
        self._gap_sum = 0
        self._gap_n = 0

    def bind(self, cache: Any) -> None:
        self._cache = cache

    def make_queue(self) -> Any:
        return PredictQueue(self)

    def now(self) -> int:
        return int(self._cache._clock) if self._cache is not None else 0

    def mean_gap(self) -> int:
        return self._gap_sum // self._gap_n if self._gap_n else 1

    def predict(self, node: Any) -> tuple[int, int]:
        """(predicted next use, overdue deadline) of a node, in logical clock ticks."""
        gap = node.gap if node.gap > 0 else self.mean_gap()
        return node.last_access + gap, node.last_access + int(self.slack * gap)

    def key(self, node: PolicyNode) -> PolicyKey:
        nxt, deadline = self.predict(node)
        return (deadline, -nxt)

    def on_match(self, path: list[Any], clock: int) -> None:
        """Before a recorded match updates the path: the deepest node saw a reuse after
        `clock - last_access` ticks (the rhythm of its conversation)."""
        node = path[-1]
        gap = clock - node.last_access
        node.gap = gap
        self._gap_sum += gap
        self._gap_n += 1

    def on_insert(self, node: Any) -> None:
        """A new leaf continues its parent's conversation: it inherits the parent's gap."""
        parent = node.parent
        node.gap = parent.gap if parent is not None else 0

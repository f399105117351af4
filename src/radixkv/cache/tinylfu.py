"""TinyLFU admission over S3-FIFO's probation / main segments (the `tinylfu` policy).

S3-FIFO admits a new leaf to main only when its first page's ghost is still remembered, and a
ghost lives for about one cache's worth of evictions. TinyLFU remembers far longer at a few bits
per entry: a count-min sketch (4 rows, saturating counters, halved every `sample` increments so
old popularity fades) counts how often each leaf key (depth, first page) was inserted or matched.
A new leaf whose key the sketch has already seen `threshold` times starts in main; the rest go on
probation as in S3-FIFO. Matches count every node of the matched path, so a prefix many requests
share (a system prompt, a long document) is admitted to main when it is cut and re-inserted.

Parameters (width 2^16 per row, sample = 8 x width, threshold 2: "seen before") follow the
TinyLFU paper's defaults; they were not tuned on the Mooncake traces. Every hook is O(depth of
the match) or O(1) amortised (aging halves the table once per `sample` increments).
"""

from __future__ import annotations

from typing import Any

from radixkv.cache.keys import TOKEN_BYTES
from radixkv.cache.segmented import S3FIFOPolicy, SegmentedQueue

_SEEDS = (0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F)


class CountMinSketch:
    """Approximate counts of hashable keys (overestimates only); counters saturate at 15."""

    def __init__(self, width_bits: int = 16, sample_factor: int = 8) -> None:
        self.mask = (1 << width_bits) - 1
        self.rows = [[0] * (1 << width_bits) for _ in _SEEDS]
        self.sample = sample_factor << width_bits
        self.added = 0

    def _slots(self, key: int) -> list[int]:
        return [hash((key, s)) & self.mask for s in _SEEDS]

    def add(self, key: int) -> None:
        for row, i in zip(self.rows, self._slots(key), strict=True):
            if row[i] < 15:
                row[i] += 1
        self.added += 1
        if self.added >= self.sample:  # aging: halve every counter (amortised O(1))
            self.rows = [[c >> 1 for c in row] for row in self.rows]
            self.added //= 2

    def estimate(self, key: int) -> int:
        return min(row[i] for row, i in zip(self.rows, self._slots(key), strict=True))


class TinyLFUPolicy(S3FIFOPolicy):
    """S3-FIFO (probation / main / ghosts) with a frequency-sketch admission to main."""

    name = "tinylfu"

    def __init__(self, threshold: int = 2, small: float = 0.1) -> None:
        super().__init__(small=small)
        self.threshold = threshold
        self.sketch = CountMinSketch()

    def _skey(self, node: Any) -> int:
        pb = self._cache.page_size * TOKEN_BYTES
        return hash((node.depth, node.key[:pb]))

    def on_match(self, path: list[Any], clock: int) -> None:
        for node in path:
            self.sketch.add(self._skey(node))

    def on_insert(self, node: Any) -> None:
        super().on_insert(node)  # ghosts first (may already admit it to main)
        key = self._skey(node)
        self.sketch.add(key)
        if self.sketch.estimate(key) >= self.threshold:
            node.hits = max(node.hits, 2)


class DuelQueue(SegmentedQueue):
    """W-TinyLFU's duel: probation's candidate is evicted only if the sketch counts it no more
    often than main's LRU victim; otherwise the candidate moves to main and the victim goes."""

    policy: WTinyLFUPolicy

    def pop(self) -> Any:
        total = self.tokens[0] + self.tokens[1]
        if self.tokens[0] <= self.policy.small * total or not len(self.queues[1]):
            return super().pop()
        cand = self.queues[0].pop()
        if cand is None:
            return super().pop()
        self._forget(cand)
        victim = self.queues[1].pop()
        self._forget(victim)
        if self.policy.freq(cand) > self.policy.freq(victim):
            cand.hits = max(cand.hits, 2)
            self.push(cand)
            self.policy.last_segment = 1
            return victim
        self.push(victim)
        self.policy.last_segment = 0
        return cand


class WTinyLFUPolicy(TinyLFUPolicy):
    """`tinylfu` plus the duel (`DuelQueue`) at every probation eviction."""

    name = "wtinylfu"

    def freq(self, node: Any) -> int:
        return self.sketch.estimate(self._skey(node))

    def make_queue(self) -> Any:
        return DuelQueue(self)

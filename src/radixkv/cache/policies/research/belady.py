"""Belady's offline optimum for a prefix cache at page granularity (the yardstick, not a policy).

The request stream is given as page keys: request t is the list of keys of its whole pages in
prefix order, where a key names the whole prefix that ends with that page (`page_keys` chains a
hash over the tokens, so equal keys mean equal prefixes). Each request first hits on its leading
cached pages, then all its pages are cached, then the cache is trimmed to `capacity_pages` by
evicting the page whose next use is furthest in the future (never used again first), deeper
pages first on ties.

Why that is the optimum with prefix semantics: a page's next use is never later than its
child's (whoever uses the child uses the parent), so the furthest page, deepest on ties, never
has a cached child: the cache stays closed under prefixes ("leaf-first") while following the
classic farthest-in-future rule, which is optimal even without that constraint. Cost:
O(P log P) for P page references. `tests/cache` checks it against brute force on tiny traces.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from radixkv.cache.keys import TOKEN_BYTES, token_key

PageKey = Hashable
NEVER = 1 << 62  # "next use" of a page that is never used again


def page_keys(tokens: object, page_size: int, namespace: Hashable | None = None) -> list[int]:
    """Chained keys of every whole page of `tokens` (anything `token_key` takes): key j hashes
    key j-1 with page j's tokens, seeded by the namespace. Python's 64-bit hash (about 0.1 µs a
    page, so page 1 stays cheap on long prompts); keys compare only within one process."""
    q = token_key(tokens)
    pb = page_size * TOKEN_BYTES
    prev = hash(("radixkv-page-keys", namespace))
    out = []
    for pos in range(0, len(q) - len(q) % pb, pb):
        prev = hash((prev, q[pos : pos + pb]))
        out.append(prev)
    return out


@dataclass
class BeladyResult:
    """Hit pages per request (the leading pages that were cached on arrival)."""

    capacity_pages: int
    hit_pages: list[int]
    evicted_pages: int = 0
    peak_pages: int = 0

    @property
    def total_hit_pages(self) -> int:
        return sum(self.hit_pages)


def next_uses(requests: Sequence[Sequence[PageKey]]) -> list[list[int]]:
    """For each request t and page j: the index of the next request that holds the same key
    (`NEVER` if none)."""
    seen: dict[PageKey, int] = {}
    out: list[list[int]] = [[] for _ in requests]
    for t in range(len(requests) - 1, -1, -1):
        keys = requests[t]
        out[t] = [seen.get(k, NEVER) for k in keys]
        for k in keys:
            seen[k] = t
    return out


def belady(requests: Sequence[Sequence[PageKey]], capacity_pages: int) -> BeladyResult:
    """Replay `requests` (page keys in prefix order) through the optimal cache of
    `capacity_pages` pages; see the module docstring for the model."""
    if capacity_pages < 0:
        raise ValueError(f"capacity must be >= 0 pages, got {capacity_pages}")
    nxt = next_uses(requests)
    cached: dict[PageKey, int] = {}  # key -> its current next use (the live heap entry's)
    heap: list[tuple[int, int, int, PageKey]] = []  # (-next use, -depth, seq, key)
    res = BeladyResult(capacity_pages, [])
    seq = 0
    for t, keys in enumerate(requests):
        hit = 0
        while hit < len(keys) and keys[hit] in cached:
            hit += 1
        res.hit_pages.append(hit)
        for depth, (key, use) in enumerate(zip(keys, nxt[t], strict=True)):
            cached[key] = use
            heapq.heappush(heap, (-use, -depth, seq, key))
            seq += 1
        res.peak_pages = max(res.peak_pages, len(cached))
        while len(cached) > capacity_pages:
            neg_use, _, _, key = heapq.heappop(heap)
            if cached.get(key) != -neg_use:
                continue  # stale: the page was used (and re-keyed) or evicted since
            del cached[key]
            res.evicted_pages += 1
        if len(heap) > 4 * len(cached) + 1024:  # drop stale entries: memory stays O(cache)
            heap = [e for e in heap if cached.get(e[3]) == -e[0]]
            heapq.heapify(heap)
    return res

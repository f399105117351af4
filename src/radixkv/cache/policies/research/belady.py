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
from collections.abc import Generator, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from radixkv.cache.keys import token_key

PageKey = Hashable
NEVER = 1 << 62  # "next use" of a page that is never used again
# Requests as page keys: lists of keys, or `page_keys_array` rows.
Rows = Sequence[Sequence[PageKey] | npt.NDArray[np.uint64]]


def page_keys(tokens: object, page_size: int, namespace: Hashable | None = None) -> list[int]:
    """Chained keys of every whole page of `tokens` (anything `token_key` takes): key j names
    the whole prefix that ends with page j, seeded by the namespace, so equal keys mean equal
    prefixes (up to a 64-bit hash's collisions). Keys compare only within one process (the
    namespace seed is Python's salted hash)."""
    keys: list[int] = page_keys_array(tokens, page_size, namespace).tolist()
    return keys


def page_keys_array(
    tokens: object, page_size: int, namespace: Hashable | None = None
) -> npt.NDArray[np.uint64]:
    """`page_keys` as a uint64 array, computed vectorized (`_chain_keys`: about 15 ns a page,
    0.5 ms for a 32k-token prompt at page size 1; making Python ints of them costs twice that,
    which `belady_steps` does in its slices)."""
    q = np.frombuffer(token_key(tokens), dtype="<i8")
    pages = len(q) // page_size
    if pages == 0:
        return np.empty(0, dtype=np.uint64)
    seed = hash(("radixkv-page-keys", namespace)) & _MASK
    return _chain_keys(q[: pages * page_size].reshape(pages, page_size), seed)


_MASK = (1 << 64) - 1
_B = 0x9E3779B97F4A7C15  # odd: invertible modulo 2**64
_B_INV = pow(_B, -1, 1 << 64)
_POW_CACHE: list[npt.NDArray[np.uint64]] = []


def _mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64's finalizer, element-wise (uint64 arithmetic wraps modulo 2**64)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _powers(n: int) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """B**i and B**-i modulo 2**64 for i < n (grown and kept: every prompt reuses them)."""
    if not _POW_CACHE or len(_POW_CACHE[0]) < n:
        size = max(n, 2 * len(_POW_CACHE[0]) if _POW_CACHE else 4096)
        with np.errstate(over="ignore"):
            fwd = np.cumprod(np.full(size, _B, dtype=np.uint64), dtype=np.uint64) * np.uint64(
                _B_INV
            )
            inv = np.cumprod(np.full(size, _B_INV, dtype=np.uint64), dtype=np.uint64) * np.uint64(
                _B
            )
        _POW_CACHE[:] = [fwd, inv]
    return _POW_CACHE[0][:n], _POW_CACHE[1][:n]


def _chain_keys(pages: npt.NDArray[np.int64], seed: int) -> npt.NDArray[np.uint64]:
    """Key j = mix(H_j), H_j = H_(j-1) * B + v_j, H_(-1) = seed, where v_j mixes page j's tokens
    with their positions (a position in the mix keeps structured token strings, e.g. two tokens
    in a Thue-Morse order, from colliding as they do in a plain polynomial hash modulo 2**64).
    The chain is computed at once: H_j = B**(j+1) * (seed + sum_{i<=j} v_i * B**-(i+1))."""
    n, width = pages.shape
    with np.errstate(over="ignore"):
        pos = np.arange(n * width, dtype=np.uint64).reshape(n, width)
        tok = _mix(pages.astype(np.uint64) ^ _mix(pos + np.uint64(0x632BE59BD9B4E019)))
        fwd, inv = _powers(max(n, width) + 1)
        # Within a page: a polynomial over its tokens in order (width 1: the token itself).
        v = (tok * fwd[width - 1 :: -1][:width] if width > 1 else tok).sum(axis=1, dtype=np.uint64)
        h = (np.cumsum(v * inv[1 : n + 1], dtype=np.uint64) + np.uint64(seed)) * fwd[1 : n + 1]
        return _mix(h)


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
    return _drain(_next_uses(requests, 1 << 62))


def _next_uses(
    requests: Sequence[Sequence[PageKey]], chunk: int
) -> Generator[None, None, list[list[int]]]:
    """`next_uses`, pausing (a bare `yield`) after every `chunk` pages."""
    seen: dict[PageKey, int] = {}
    out: list[list[int]] = [[] for _ in requests]
    for t in range(len(requests) - 1, -1, -1):
        keys = requests[t]
        row: list[int] = []
        for i in range(0, len(keys), chunk):  # a long request is cut too
            part = keys[i : i + chunk]
            row.extend(seen.get(k, NEVER) for k in part)
            yield
        out[t] = row
        for k in keys:
            seen[k] = t
    return out


def belady(requests: Rows, capacity_pages: int) -> BeladyResult:
    """Replay `requests` (page keys in prefix order) through the optimal cache of
    `capacity_pages` pages; see the module docstring for the model."""
    return _drain(belady_steps(requests, capacity_pages, 1 << 62))


def belady_steps(
    requests: Rows, capacity_pages: int, chunk: int = 4096
) -> Generator[None, None, BeladyResult]:
    """`belady` as a resumable job: it pauses (a bare `yield`) after about every `chunk` page
    references (a long request is cut too) and returns the result (StopIteration.value), so a
    caller on a latency-bound thread can spread one replay over short slices
    (`RegretWindow.advance`). Nothing outside the job changes while it is paused."""
    if capacity_pages < 0:
        raise ValueError(f"capacity must be >= 0 pages, got {capacity_pages}")
    rows = yield from _as_lists(requests, chunk)  # `page_keys_array` rows as ints
    nxt = yield from _next_uses(rows, chunk)
    cached: dict[PageKey, int] = {}  # key -> its current next use (the live heap entry's)
    heap: list[tuple[int, int, int, PageKey]] = []  # (-next use, -depth, seq, key)
    res = BeladyResult(capacity_pages, [])
    seq = 0
    for t, keys in enumerate(rows):
        hit = 0
        while hit < len(keys) and keys[hit] in cached:
            hit += 1
        res.hit_pages.append(hit)
        for depth, (key, use) in enumerate(zip(keys, nxt[t], strict=True)):
            cached[key] = use
            heapq.heappush(heap, (-use, -depth, seq, key))
            seq += 1
            if seq % chunk == 0:
                yield
        res.peak_pages = max(res.peak_pages, len(cached))
        while len(cached) > capacity_pages:
            neg_use, _, _, key = heapq.heappop(heap)
            if cached.get(key) != -neg_use:
                continue  # stale: the page was used (and re-keyed) or evicted since
            del cached[key]
            res.evicted_pages += 1
            if res.evicted_pages % chunk == 0:
                yield
        if len(heap) > 4 * len(cached) + 1024:  # drop stale entries: memory stays O(cache)
            live: list[tuple[int, int, int, PageKey]] = []
            for i in range(0, len(heap), chunk):
                live.extend(e for e in heap[i : i + chunk] if cached.get(e[3]) == -e[0])
                yield
            heap = live
            heapq.heapify(heap)
    yield from _release(chunk, heap, nxt, rows, cached)
    return res


def _release(chunk: int, *parts: list[Any] | dict[Any, Any]) -> Generator[None, None, None]:
    """Empty the job's containers a slice at a time: letting go of 10^5 objects at once (the
    heap's tuples, the keys as ints) takes milliseconds of its own."""
    for part in parts:
        while part:
            if isinstance(part, dict):
                for _ in range(min(chunk, len(part))):
                    part.popitem()
            else:
                done = 0
                while part and done < chunk:  # a row of keys counts as its length
                    item = part.pop()
                    done += len(item) if isinstance(item, list) else 1
            yield


def _as_lists(requests: Rows, chunk: int) -> Generator[None, None, list[Sequence[PageKey]]]:
    """Each row as a list of Python ints (dict keys hash fastest so), pausing between rows."""
    out: list[Sequence[PageKey]] = []
    for r in requests:
        out.append(r.tolist() if isinstance(r, np.ndarray) else r)
        if len(r) >= chunk:
            yield
    return out


T = TypeVar("T")


def _drain(job: Generator[None, None, T]) -> T:
    """Run a resumable job to its end; its result."""
    while True:
        try:
            next(job)
        except StopIteration as stop:
            result: T = stop.value
            return result

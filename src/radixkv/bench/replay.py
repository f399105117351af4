"""Trace replay: how many prompt tokens a prefix cache of a given capacity would have reused.

For each request in arrival order: match its token ids, count the hit (capped at the input
length), insert all its tokens (fresh slot ids; the cache keeps whole pages only), then evict
until the cache holds at most `capacity` tokens. Nothing is locked: a replayed request has
finished before the next one arrives. The infinite-capacity run (no eviction) is the ideal.

Belady's offline optimum runs over the same requests at page granularity (`replay_belady`), and
each online policy gets the share of the lru -> belady gap it closes. Session-aware policies hold a
session's path until its last request, as the engine does.

Programmatic use: `load_trace(path)` then `replay(requests, factory, capacity)` or `replay_grid`.
`radixkv replay TRACE ...` (replay_cli.py) prints a table per trace of capacity × policy, and
writes JSON and a plot on request.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import numpy as np

from radixkv.bench.inputs.traces import TraceRequest, trace_summary
from radixkv.cache import available_policies
from radixkv.cache.base import PrefixCache

CacheFactory = Callable[[], PrefixCache]
ORACLES = ("belady",)  # offline optima: they know the future; marked in every table
POLICIES = (*available_policies(), *ORACLES)
DEFAULT_POLICIES = ("lru", "lfu", "fifo")
# Default capacities, as fractions of the ideal run's footprint (tokens it ends up holding).
DEFAULT_CAPACITY_FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.4)


@dataclass
class ReplayResult:
    """Counters of one replay. Rates are over all requests of the run, in tokens or blocks."""

    capacity: int | None  # None: infinite (the ideal)
    policy: str
    cache: str = ""
    page_size: int = 0
    requests: int = 0
    input_tokens: int = 0
    hit_tokens: int = 0
    blocks: int = 0
    hit_blocks: int = 0
    inserted_new_tokens: int = 0
    evicted_tokens: int = 0
    final_size: int = 0
    peak_size: int = 0
    wall_s: float = 0.0
    cache_stats: dict[str, int] = field(default_factory=dict)  # the cache's own accounting

    sessions_closed: int = 0  # session-aware policies: sessions closed after their last request
    gap_closed: float | None = None  # (this - lru) / (belady - lru) at the same capacity

    @property
    def oracle(self) -> bool:
        return self.policy in ORACLES

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def block_hit_rate(self) -> float:
        return self.hit_blocks / self.blocks if self.blocks else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["token_hit_rate"] = self.token_hit_rate
        d["block_hit_rate"] = self.block_hit_rate
        d["oracle"] = self.oracle
        return d


def _progress(
    requests: Sequence[TraceRequest], progress: bool, desc: str
) -> Iterable[TraceRequest]:
    if not progress:
        return requests
    from tqdm import tqdm

    return tqdm(requests, desc=desc, unit="req", file=sys.stderr, mininterval=0.5, leave=False)


def replay(
    requests: Sequence[TraceRequest],
    cache_factory: CacheFactory,
    capacity: int | None = None,
    *,
    policy: str = "",
    progress: bool = False,
    check_every: int = 0,
) -> ReplayResult:
    """Replay `requests` through a fresh cache; `capacity` in tokens (None: never evict).

    A request's hit blocks are the blocks wholly inside its matched prefix (a partial last block
    counts once the match covers it; Claude Code's unhashed tail is not a block). `check_every`
    > 0 runs `check_integrity()` every that many requests (tests).
    """
    cache = cache_factory()
    res = ReplayResult(capacity, policy, type(cache).__name__, cache.page_size)
    sessions = session_ends(requests) if policy.startswith("session-") else {}
    next_slot = 0
    start = time.perf_counter()
    desc = f"{policy or 'ideal'} cap={fmt_tokens(capacity)}"
    for i, req in enumerate(_progress(requests, progress, desc), 1):
        # The protocol types tokens as Sequence[int]; the caches take numpy arrays too.
        tokens = cast(Sequence[int], req.token_ids())
        n = len(tokens)
        hit = min(cache.match(tokens).length, req.input_length)
        res.hit_tokens += hit
        res.hit_blocks += req.num_blocks if hit >= req.hashed_length else hit // req.block_size
        res.input_tokens += req.input_length
        res.blocks += req.num_blocks
        before = cache.total_size
        cache.insert(tokens, np.arange(next_slot, next_slot + n, dtype=np.int64))
        next_slot += n  # slot ids are never reused: each cached token owns a distinct one
        res.inserted_new_tokens += cache.total_size - before
        if sessions:
            res.sessions_closed += hold_session(cache, req, tokens, sessions.get(req.session) == i)
        res.peak_size = max(res.peak_size, cache.total_size)
        if capacity is not None and cache.total_size > capacity:
            res.evicted_tokens += len(cache.evict(cache.total_size - capacity))
        if check_every and i % check_every == 0:
            cache.check_integrity()
    res.requests = len(requests)
    res.final_size = cache.total_size
    res.cache_stats = {k: int(v) for k, v in asdict(cache.stats()).items()}
    res.wall_s = time.perf_counter() - start
    return res


# ---------------------------------------------------------------- oracle and sessions


def session_ends(requests: Sequence[TraceRequest]) -> dict[str, int]:
    """Session id -> 1-based index of its last request (when the replay closes it)."""
    return {r.session: i for i, r in enumerate(requests, 1) if r.session}


def hold_session(cache: Any, req: TraceRequest, tokens: Sequence[int], last: bool) -> int:
    """The request's session now references the path just inserted; after the session's last
    request the session closes (its reference drops). Returns 1 on a close."""
    if not req.session or not hasattr(cache, "hold_session"):
        return 0
    if last:
        cache.release_session(req.session)
        return 1
    cache.hold_session(req.session, cache.match(tokens, record=False).handle)
    return 0


def replay_belady(requests: Sequence[TraceRequest], capacity: int, page_size: int) -> ReplayResult:
    """Belady's offline optimum at `capacity` tokens (whole pages), counted like `replay`.

    A page's key is the id of its last token: trace token ids are `block * block_size +
    offset` over chained block ids, so that one id already names the whole prefix (and costs
    nothing to compute, unlike hashing every page)."""
    start = time.perf_counter()
    keys = [trace_page_keys(r, page_size) for r in requests]
    from radixkv.cache.policies.research.belady import belady  # the oracle: loaded when run

    opt = belady(keys, capacity // page_size)
    res = ReplayResult(capacity, "belady", "oracle", page_size, requests=len(requests))
    for req, pages in zip(requests, opt.hit_pages, strict=True):
        hit = min(pages * page_size, req.input_length)
        res.hit_tokens += hit
        res.hit_blocks += req.num_blocks if hit >= req.hashed_length else hit // req.block_size
        res.input_tokens += req.input_length
        res.blocks += req.num_blocks
    res.evicted_tokens = opt.evicted_pages * page_size
    res.peak_size = opt.peak_pages * page_size
    res.wall_s = time.perf_counter() - start
    return res


def trace_page_keys(req: TraceRequest, page_size: int) -> list[int]:
    tokens = req.token_ids()
    full = len(tokens) // page_size * page_size
    keys: list[int] = tokens[page_size - 1 : full : page_size].tolist()
    return keys


def fill_gap_closed(results: Sequence[ReplayResult]) -> None:
    """Where lru and belady ran at a capacity, each online policy there gets the fraction of the
    lru -> belady gap it closes (None where the gap is empty)."""
    by_cap: dict[int | None, dict[str, ReplayResult]] = {}
    for r in results:
        by_cap.setdefault(r.capacity, {})[r.policy] = r
    for runs in by_cap.values():
        lru, opt = runs.get("lru"), runs.get("belady")
        if lru is None or opt is None or opt.hit_tokens <= lru.hit_tokens:
            continue
        for r in runs.values():
            if not r.oracle:
                r.gap_closed = (r.hit_tokens - lru.hit_tokens) / (opt.hit_tokens - lru.hit_tokens)


def make_factory(kind: str, page_size: int, policy: str) -> CacheFactory:
    """A factory for the real caches of `radixkv.cache` (imported here, not at module load)."""
    from radixkv.cache import make_cache

    return lambda: make_cache(kind, page_size, policy)


def check_combinations(kind: str, page_size: int, policies: Sequence[str]) -> None:
    """Raise ValueError, before any long run, if the cache rejects a (page size, policy)."""
    for pol in policies:
        if pol not in ORACLES:
            make_factory(kind, page_size, pol)()


def default_capacities(footprint: int, page_size: int) -> list[int]:
    """Capacities at fixed fractions of the ideal footprint, 2 significant digits, ≥ 1 page."""
    caps = []
    for frac in DEFAULT_CAPACITY_FRACTIONS:
        raw = max(footprint * frac, page_size)
        scale = 10 ** max(int(np.floor(np.log10(raw))) - 1, 0)
        caps.append(int(round(raw / scale) * scale))
    return sorted(set(caps))


@dataclass
class TraceReport:
    """All runs over one trace: the ideal plus capacity × policy."""

    path: str
    summary: dict[str, Any]
    cache: str
    page_size: int
    ideal: ReplayResult
    results: list[ReplayResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "summary": self.summary,
            "cache": self.cache,
            "page_size": self.page_size,
            "ideal": self.ideal.to_dict(),
            "results": [r.to_dict() for r in self.results],
        }


def replay_grid(
    path: str,
    requests: Sequence[TraceRequest],
    *,
    cache_kind: str = "radix",
    page_size: int | None = None,
    capacities: Sequence[int] | None = None,
    policies: Sequence[str] = DEFAULT_POLICIES,
    progress: bool = False,
) -> TraceReport:
    """The ideal run, then one run per (capacity, policy). `page_size` defaults to the trace's
    block size; `capacities` default to fractions of the ideal footprint."""
    page = page_size or (requests[0].block_size if requests else 1)
    check_combinations(cache_kind, page, policies)
    ideal = replay(requests, make_factory(cache_kind, page, "lru"), None, progress=progress)
    report = TraceReport(path, trace_summary(requests), cache_kind, page, ideal)
    caps = list(capacities) if capacities else default_capacities(ideal.final_size, page)
    for cap in sorted(caps):
        for pol in policies:
            if pol == "belady":
                report.results.append(replay_belady(requests, cap, page))
                continue
            fac = make_factory(cache_kind, page, pol)
            report.results.append(replay(requests, fac, cap, policy=pol, progress=progress))
    fill_gap_closed(report.results)
    return report


def fmt_tokens(n: int | None) -> str:
    """A capacity for a table or progress bar: `inf`, `64k`, `1.5M`."""
    if n is None:
        return "inf"
    for unit, div in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= div and n % (div // 100 or 1) == 0:
            return f"{n / div:g}{unit}"
    return str(n)

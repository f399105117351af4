"""Replay helpers for the oracle and session-aware policies (split out of replay.py).

`replay_belady` runs Belady's offline optimum over a trace at page granularity, counted like
`replay`; `fill_gap_closed` adds, per capacity, the share of the lru -> belady gap each online
policy closes; `session_ends` / `hold_session` let a replay hold and close sessions the way the
engine does (each session closes after its last request).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from radixkv.bench.traces import TraceRequest
from radixkv.cache.belady import belady

if TYPE_CHECKING:
    from radixkv.bench.replay import ReplayResult


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
    opt = belady(keys, capacity // page_size)
    from radixkv.bench.replay import ReplayResult

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

"""Trace replay: how many prompt tokens a prefix cache of a given capacity would have reused.

For each request in arrival order: match its token ids, count the hit (capped at the input
length), insert all its tokens (fresh slot ids; the cache keeps whole pages only), then evict
until the cache holds at most `capacity` tokens. Nothing is locked: a replayed request has
finished before the next one arrives. The infinite-capacity run (no eviction) is the ideal.

`radixkv replay TRACE ...` prints a table per trace and capacity × policy, and writes JSON and a
plot on request. Programmatic use: `load_trace(path)` then `replay(requests, factory, capacity)`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from radixkv.bench.replay_oracle import fill_gap_closed, hold_session, replay_belady, session_ends
from radixkv.bench.trace_files import (
    DEFAULT_REPLAY_TRACE,
    NAMED_TRACES,
    display_args,
    display_path,
    resolve_trace,
)
from radixkv.bench.traces import DEFAULT_SESSION_GAP_S, TraceRequest, load_trace, trace_summary
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
    desc = f"{policy or 'ideal'} cap={_fmt_tokens(capacity)}"
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


# ---------------------------------------------------------------- output


def _fmt_tokens(n: int | None) -> str:
    if n is None:
        return "inf"
    for unit, div in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= div and n % (div // 100 or 1) == 0:
            return f"{n / div:g}{unit}"
    return str(n)


def parse_tokens(text: str) -> int:
    """`4000`, `64k`, `1.5M`, `2G` (decimal units) → tokens."""
    units = {"k": 10**3, "m": 10**6, "g": 10**9}
    t = text.strip().lower()
    mult = units.get(t[-1:], 1)
    value = float(t[:-1] if mult > 1 else t) * mult
    if value <= 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"not a positive token count: {text!r}")
    return int(value)


def format_table(report: TraceReport) -> str:
    """A fixed-width table: the ideal row first, then capacity × policy."""
    s = report.summary
    head = (
        f"{report.path}: {s['requests']} requests, {s['input_tokens']:,} input tokens, "
        f"block {s['block_size']}, cache {report.cache} page {report.page_size}, "
        f"ideal footprint {report.ideal.final_size:,} tokens"
    )
    cols = f"{'capacity':>10} {'policy':>14} {'token hit':>10} {'block hit':>10} "
    cols += f"{'gap closed':>11} {'evicted tokens':>15} {'wall s':>8}"
    lines = [head, cols, "-" * len(cols)]
    for r in [report.ideal, *report.results]:
        name = (r.policy or "ideal") + (" *" if r.oracle else "")
        gap = f"{r.gap_closed:>10.0%}" if r.gap_closed is not None else f"{'':>10}"
        lines.append(
            f"{_fmt_tokens(r.capacity):>10} {name:>14} "
            f"{r.token_hit_rate:>9.2%} {r.block_hit_rate:>10.2%} {gap:>11} "
            f"{r.evicted_tokens:>15,} {r.wall_s:>8.1f}"
        )
    if any(r.oracle for r in report.results):
        lines.append("* oracle (offline optimum: knows the future; not an online policy)")
    return "\n".join(lines)


# ---------------------------------------------------------------- command line


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `radixkv replay`."""
    p = subparsers.add_parser(
        "replay",
        help="replay public prefix traces through the cache (hit rate vs capacity)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "traces",
        nargs="*",
        default=[DEFAULT_REPLAY_TRACE],
        metavar="TRACE",
        help="Mooncake .jsonl, Claude Code .tar.xz archive, a directory of trace_*.json, "
        "or one trace .json (format auto-detected); or a trace shipped in data/traces/, by "
        f"path there or by name ({', '.join(NAMED_TRACES)}); default: {DEFAULT_REPLAY_TRACE}",
    )
    p.add_argument(
        "--capacity-tokens",
        nargs="+",
        type=parse_tokens,
        metavar="N",
        help="cache capacities in tokens (suffix k/M/G ok); default: "
        + ", ".join(f"{100 * f:g}%%" for f in DEFAULT_CAPACITY_FRACTIONS)
        + " of the ideal footprint",
    )
    p.add_argument(
        "--policy",
        nargs="+",
        choices=(*POLICIES, "all"),
        metavar="POLICY",
        help=f"eviction policies, of {', '.join(POLICIES)} (belady: the offline optimum, an "
        f"oracle), or 'all'; default: {' '.join(DEFAULT_POLICIES)} (radix), lru (blockhash "
        "supports only lru)",
    )
    p.add_argument(
        "--cache", choices=("radix", "blockhash"), default="radix", help="default: %(default)s"
    )
    p.add_argument(
        "--page-size",
        type=int,
        metavar="P",
        help="cache page size; default: the trace's block size (512 Mooncake, 64 Claude Code)",
    )
    p.add_argument(
        "--limit", type=int, metavar="N", help="replay only the first N requests of each trace"
    )
    p.add_argument(
        "--session-gap",
        type=_session_gap,
        default=DEFAULT_SESSION_GAP_S,
        metavar="S|sequential",
        help="Claude Code: session k (sessions sorted by id) starts at k*S seconds, or with "
        "'sequential' when session k-1's last request arrives; default %(default)s",
    )
    p.add_argument(
        "--max-sessions", type=int, metavar="N", help="Claude Code: keep the first N sessions"
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="write all results as JSON here")
    p.add_argument(
        "--plot", type=Path, metavar="PATH.png", help="draw hit rate vs capacity per policy"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    p.set_defaults(func=run)


def _session_gap(text: str) -> float | None:
    if text == "sequential":
        return None
    gap = float(text)
    if gap < 0:
        raise argparse.ArgumentTypeError("session gap must be >= 0 or 'sequential'")
    return gap


def run(args: argparse.Namespace) -> int:
    """`radixkv replay`: load each trace, run the grid, print tables, then JSON and plot."""
    gap = args.session_gap
    reports: list[TraceReport] = []
    for name in args.traces:
        try:
            resolved = resolve_trace(name)
        except FileNotFoundError as exc:
            print(f"radixkv replay: {exc}", file=sys.stderr)
            return 2
        path = display_path(resolved)  # what the table, JSON and plot call it
        t0 = time.perf_counter()
        requests = load_trace(resolved, session_gap=gap, max_sessions=args.max_sessions)
        if args.limit is not None:
            requests = requests[: args.limit]
        load_s = time.perf_counter() - t0
        print(f"loaded {path}: {len(requests)} requests in {load_s:.1f} s", file=sys.stderr)
        page = args.page_size or (requests[0].block_size if requests else 1)
        policies = args.policy or (DEFAULT_POLICIES if args.cache == "radix" else ("lru",))
        if "all" in policies:
            policies = POLICIES if args.cache == "radix" else ("lru", *ORACLES)
        try:
            check_combinations(args.cache, page, policies)
        except ValueError as exc:  # e.g. a policy the chosen cache does not support
            print(f"radixkv replay: {exc}", file=sys.stderr)
            return 2
        report = replay_grid(
            path,
            requests,
            cache_kind=args.cache,
            page_size=page,
            capacities=args.capacity_tokens,
            policies=policies,
            progress=not args.no_progress,
        )
        reports.append(report)
        print(format_table(report), flush=True)
        print()
    if args.json:
        doc = {"argv": display_args(sys.argv[1:]), "traces": [r.to_dict() for r in reports]}
        args.json.write_text(json.dumps(doc, indent=2))
    if args.plot:
        from radixkv.bench.plot import plot_hit_rates

        plot_hit_rates(reports, args.plot)
    return 0

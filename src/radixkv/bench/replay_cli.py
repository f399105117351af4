"""`radixkv replay TRACE ...`: a table per trace of capacity × policy (token and block hit rates,
the share of the lru -> belady gap closed), and JSON and a plot on request. The replay itself is
`radixkv.bench.replay`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from radixkv.bench import replay as replay_lib
from radixkv.bench.inputs.trace_files import (
    DEFAULT_REPLAY_TRACE,
    NAMED_TRACES,
    display_args,
    display_path,
    resolve_trace,
)
from radixkv.bench.inputs.traces import DEFAULT_SESSION_GAP_S, load_trace
from radixkv.bench.replay import (
    DEFAULT_CAPACITY_FRACTIONS,
    DEFAULT_POLICIES,
    ORACLES,
    POLICIES,
    TraceReport,
    check_combinations,
    fmt_tokens,
    replay_grid,
)


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
            f"{fmt_tokens(r.capacity):>10} {name:>14} "
            f"{r.token_hit_rate:>9.2%} {r.block_hit_rate:>10.2%} {gap:>11} "
            f"{r.evicted_tokens:>15,} {r.wall_s:>8.1f}"
        )
    if any(r.oracle for r in report.results):
        lines.append("* oracle (offline optimum: knows the future; not an online policy)")
    return "\n".join(lines)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `radixkv replay`."""
    p = subparsers.add_parser(
        "replay",
        help="replay public prefix traces through the cache (hit rate vs capacity)",
        description=replay_lib.__doc__,
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
        from radixkv.bench.plots import plot_hit_rates

        plot_hit_rates(reports, args.plot)
    return 0

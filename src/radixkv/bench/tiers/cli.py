"""`radixkv bench tiers`: what the host (L2) and storage (L3) tiers buy, through the HTTP server.

Multi-turn, shaped like SGLang's HiCache benchmark (radixkv.bench.tiers.multiturn): `--clients`
conversations x `--rounds` rounds, each round every client's whole history plus a new turn of
`--turn-len` tokens, `--output-len` tokens out, `--concurrency` requests in flight, rounds in
order (round r+1 starts when round r has answered). For each mode a real `radixkv serve` process
is started with the device pool (L1, `--num-slots`) sized to `--l1-frac` of the final working
set; L1+L2 adds `--enable-hierarchical-cache` (L2 at its default size unless `--hicache-size`),
L1+L2+L3 adds a file directory (or `--storage-url redis://...`) with the DEFAULT prefetch policy.
L1-all gives the device pool the whole working set (and the requests in flight): the throughput
of a perfect cache on this machine, the most any tier can reach. Per round: the server's token
hit rate against the ideal (every earlier token cached), the effective input throughput (prompt
tokens / wall time), TTFT and TPOT, and which tier served the hits (/cache/stats). A mode whose
server refuses its flags (e.g. a hybrid model while hybrid tiers are missing) is reported with
the server's error and the run goes on.

Restart: a `--prefix-len`-token prefix is computed by one server with L3, which then shuts down
cleanly (flushing L3); fresh servers (empty tree, empty L2) without and with L3 then answer a new
request on that prefix: TTFT and cached tokens of each.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from radixkv.bench.tiers import multiturn as mt

# L1-all: a device pool that holds the whole working set, no tiers. What a perfect cache gives on
# this machine and model (every earlier token cached, nothing loaded), so no tier can beat it: the
# ceiling of the "vs L1" column, measured rather than assumed.
MODES = ("L1", "L1+L2", "L1+L2+L3", "L1-all")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "tiers", help="multi-turn tier benchmark through the server: L1 vs L1+L2 vs L1+L2+L3"
    )
    p.add_argument("--model", default=None, help="checkpoint dir or short name (default model)")
    p.add_argument("--dtype", default=None, help="server --dtype (default: the server's, auto)")
    p.add_argument("--page-size", type=int, default=16, help="server --page-size")
    w = p.add_argument_group("workload")
    w.add_argument("--clients", type=int, default=8, help="conversations")
    w.add_argument("--rounds", type=int, default=16, help="turns per conversation")
    w.add_argument("--turn-len", type=int, default=128, help="new user tokens per turn")
    w.add_argument("--output-len", type=int, default=8, help="answer tokens per turn")
    w.add_argument("--concurrency", type=int, default=2, help="requests in flight")
    w.add_argument("--l1-frac", type=float, default=1 / 3, help="device pool / working set")
    w.add_argument("--seed", type=int, default=0, help="seed of the synthetic turns")
    t = p.add_argument_group("tiers")
    t.add_argument("--hicache-size", type=float, default=None, help="L2 MiB (default: server's)")
    t.add_argument("--storage-url", default=None, help="L3 redis:// URL (default: a file dir)")
    t.add_argument("--modes", default=",".join(MODES), help="comma list of " + "|".join(MODES))
    t.add_argument("--prefix-len", type=int, default=1024, help="restart test: shared prefix")
    t.add_argument("--skip-restart", action="store_true")
    p.add_argument("--server-arg", action="append", default=[], help="extra serve flag (repeat)")
    p.add_argument("--log-dir", default=None, help="server logs here (default: a temp dir)")
    p.add_argument("--json", default=None, help="also write the results as JSON here")
    p.add_argument("--plot", default=None, help="also plot hit rate and throughput per round (PNG)")
    p.set_defaults(func=main)


def shape_of(args: argparse.Namespace) -> mt.Shape:
    return mt.Shape(args.clients, args.rounds, args.turn_len, args.output_len)


def l1_slots(shape: mt.Shape, frac: float, page: int, concurrency: int) -> int:
    """Device pool tokens: `frac` of the final working set, page-aligned up, but never below what
    the requests in flight need together (else L1 thrashes inside a step, in every mode)."""
    in_flight = concurrency * (shape.prompt_len(shape.rounds) + shape.output_len + page)
    want = max(in_flight, int(shape.working_set * frac))
    return -(-want // page) * page


def mode_slots(mode: str, shape: mt.Shape, args: argparse.Namespace) -> int:
    """L1 of a mode: `--l1-frac` of the working set, or for L1-all the whole working set and
    the requests in flight besides (nothing is ever evicted)."""
    if mode != "L1-all":
        return l1_slots(shape, args.l1_frac, args.page_size, args.concurrency)
    return l1_slots(shape, 0.0, args.page_size, args.concurrency) + l1_slots(
        shape, 1.0, args.page_size, 0
    )


def mode_flags(mode: str, args: argparse.Namespace, slots: int, l3_dir: str) -> list[str]:
    """`radixkv serve` flags of one mode. Only what the mode needs is set: every other tier flag
    (prefetch policy, write policy, timeouts) stays at the server's default."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    flags = ["--page-size", str(args.page_size), "--num-slots", str(slots)]
    if args.dtype:
        flags += ["--dtype", args.dtype]
    if mode not in ("L1", "L1-all"):
        flags.append("--enable-hierarchical-cache")
        if args.hicache_size is not None:
            flags += ["--hicache-size", str(args.hicache_size)]
    if mode == "L1+L2+L3":
        if args.storage_url:
            flags += ["--hicache-storage-backend", "redis", "--hicache-storage-url"]
            flags.append(args.storage_url)
        else:
            flags += ["--hicache-storage-backend", "file", "--hicache-storage-url", l3_dir]
    return flags + list(args.server_arg)


def _get(url: str, path: str) -> dict[str, Any]:
    import httpx

    out: dict[str, Any] = httpx.get(url + path, timeout=60).json()
    return out


def _send(url: str, model: str, prompts: list[list[int]], out_len: int, conc: int) -> Any:
    from radixkv.bench.inputs.workloads import BenchRequest
    from radixkv.bench.serving.client import ClientOptions, run_requests

    reqs = [BenchRequest(i, p, out_len, f"c{i}") for i, p in enumerate(prompts)]
    opts = ClientOptions(base_url=url, model=model, concurrency=conc)
    return asyncio.run(run_requests(reqs, opts))


def _warmup(url: str, model: str, args: argparse.Namespace) -> None:
    """Two unrelated requests of different lengths (first-call and compile costs out of round 1)."""
    rng = random.Random(10_000 + args.seed)
    prompts = [[rng.randrange(mt.ID_LO, mt.ID_HI) for _ in range(n)] for n in (48, 160)]
    _send(url, model, prompts, 2, 1)


def run_mode(
    mode: str,
    args: argparse.Namespace,
    rounds: list[list[list[int]]],
    log_dir: Path,
    save: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """One server, every round; the rows, the summary and the server's final tier stats, or the
    error that stopped it."""
    from radixkv.bench.serving.server_proc import LocalServer

    shape = shape_of(args)
    slots = mode_slots(mode, shape, args)
    ideal = mt.ideal_per_round(rounds)
    with tempfile.TemporaryDirectory(prefix="radixkv-l3-") as l3:
        flags = mode_flags(mode, args, slots, l3)
        log = log_dir / f"serve-{mode.replace('+', '_')}.log"
        shown = [f.replace(l3, "<tmp L3 dir>") for f in flags]  # no machine paths in reports
        out: dict[str, Any] = {"num_slots": slots, "server_flags": shown, "log": log.name}
        print(f"{mode}: L1 {slots} slots, starting the server ...", file=sys.stderr, flush=True)
        try:
            with LocalServer(args.model, flags, log_path=log) as srv:
                out["server"] = srv.describe()
                out["server"]["command"] = out["server"]["command"].replace(l3, "<tmp L3 dir>")
                out["dtype"] = served_dtype(log)
                model = _get(srv.url, "/v1/models")["data"][0]["id"]
                _warmup(srv.url, model, args)
                rows = []
                for r, prompts in enumerate(rounds, start=1):
                    before = _get(srv.url, "/cache/stats")["cached_tokens_by_tier"]
                    run = _send(srv.url, model, prompts, args.output_len, args.concurrency)
                    after = _get(srv.url, "/cache/stats")["cached_tokens_by_tier"]
                    tiers = {k: v - before.get(k, 0) for k, v in after.items()}
                    sent = sum(len(p) for p in prompts)
                    rows.append(
                        mt.round_record(r, run.results, run.wall_s, ideal[r - 1], sent, tiers)
                    )
                    _progress(mode, rows[-1])
                    if save is not None:  # the rounds so far, should the run be cut short
                        save({**out, "rounds": rows, "summary": mt.mode_summary(rows)})
                stats = _get(srv.url, "/cache/stats")
        except Exception as exc:  # a refused start or a dead server: reported, the run goes on
            out["error"] = str(exc)[-1500:]
            print(f"{mode}: failed: {out['error'][-300:]}", file=sys.stderr, flush=True)
            return out
    out.update(rounds=rows, summary=mt.mode_summary(rows), tier_stats=stats.get("tier_stats", {}))
    return out


def served_dtype(log: Path) -> str | None:
    """The dtype the server resolved (its "engine ready ... dtype=X" log line), if logged."""
    try:
        found = re.findall(r"engine ready .*dtype=(\w+)", log.read_text(errors="replace"))
    except OSError:
        return None
    return found[-1] if found else None


def _progress(mode: str, row: dict[str, Any]) -> None:
    print(
        f"  {mode} round {row['round']}: {row['wall_s']:.1f}s, hit "
        f"{100 * row['token_hit_rate']:.1f}% (ideal {100 * row['ideal_hit_rate']:.1f}%)",
        file=sys.stderr,
        flush=True,
    )


def _ttft(url: str, model: str, prompt: list[int]) -> dict[str, Any]:
    res = _send(url, model, [prompt], 1, 1).results[0]
    if not res.ok:
        raise RuntimeError(f"restart request failed: {res.error}")
    return {"ttft_s": res.ttft_s, "cached_tokens": res.cached_tokens}


def restart_ttft(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """TTFT of a new request on a long prefix right after a restart, without and with L3."""
    from radixkv.bench.serving.server_proc import LocalServer

    rng = random.Random(7 + args.seed)
    prefix = [rng.randrange(mt.ID_LO, mt.ID_HI) for _ in range(args.prefix_len)]
    base = ["--page-size", str(args.page_size), *(["--dtype", args.dtype] if args.dtype else [])]
    base += list(args.server_arg)
    out: dict[str, Any] = {"prefix_len": args.prefix_len}
    with tempfile.TemporaryDirectory(prefix="radixkv-l3-") as l3:
        tiers = ["--enable-hierarchical-cache", "--hicache-storage-backend", "file"]
        tiers += ["--hicache-storage-url", l3]
        with LocalServer(args.model, base + tiers, log_path=log_dir / "serve-restart-0.log") as s:
            model = _get(s.url, "/v1/models")["data"][0]["id"]
            _ttft(s.url, model, prefix + [rng.randrange(mt.ID_LO, mt.ID_HI) for _ in range(16)])
            _settle(s.url)
        for name, flags in (("without_l3", base), ("with_l3", base + tiers)):
            with LocalServer(args.model, flags, log_path=log_dir / f"serve-{name}.log") as s:
                _warmup(s.url, model, args)
                q = prefix + [rng.randrange(mt.ID_LO, mt.ID_HI) for _ in range(16)]
                out[name] = _ttft(s.url, model, q)
    out["speedup"] = out["without_l3"]["ttft_s"] / max(out["with_l3"]["ttft_s"], 1e-9)
    return out


def _settle(url: str, timeout: float = 60.0) -> None:
    """Wait until the server's L3 writes are confirmed (the clean shutdown flushes the rest)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _get(url, "/cache/stats")["tier_stats"].get("storage_pending_writes", 0) == 0:
            return
        time.sleep(0.1)


def main(args: argparse.Namespace) -> int:
    from radixkv.bench.tiers.tiers_report import format_table, plot_rounds

    # A SIGTERM (timeout, kill) unwinds like Ctrl-C, so every server started here is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    shape = shape_of(args)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    rounds = mt.build_rounds(shape, args.seed, mt.vocab_size(args.model))
    results: dict[str, Any] = {
        "model": args.model or "default (embedded SmolLM2-135M-Instruct)",
        "shape": {**asdict(shape), "concurrency": args.concurrency, "l1_frac": args.l1_frac},
        "page_size": args.page_size,
        "working_set_tokens": shape.working_set,
        "ideal_speedup": mt.ideal_speedup(rounds),
        "modes": {},
    }
    with tempfile.TemporaryDirectory(prefix="radixkv-bench-tiers-") as tmp:
        log_dir = Path(args.log_dir or tmp)

        def save(mode: str, partial: dict[str, Any] | None = None) -> None:
            if partial is not None:
                results["modes"][mode] = {**partial, "partial": True}
            results["speedup_vs_L1"] = mt.speedups(results["modes"])
            results["dtype"] = next(
                (m["dtype"] for m in results["modes"].values() if m.get("dtype")), None
            )
            if args.json:  # after every round: an interrupted run keeps what it measured
                mt.write_json(results, args.json)

        for mode in modes:
            results["modes"][mode] = run_mode(
                mode, args, rounds, log_dir, functools.partial(save, mode)
            )
            save(mode)
        if not args.skip_restart:
            try:
                results["restart"] = restart_ttft(args, log_dir)
            except Exception as exc:  # a refused start or a dead server: reported, the run goes on
                results["restart"] = {"error": str(exc)[-1500:]}
    print(format_table(results))
    if args.json:
        mt.write_json(results, args.json)
    if args.plot:
        plot_rounds(results, args.plot)
    return 0

"""`radixkv bench compare`: one workload against our server in several configurations (and any
already-running OpenAI-compatible server), one side-by-side table, JSON and plots.

Each configuration gets a fresh `python -m radixkv serve` on a free loopback port (started, waited
for on /health, stopped after its run), so no run inherits another's cache; an extra server has
its prefix cache flushed after warm-up instead. Every run sees the same seeded workload
(byte-identical prompts), the same warm-up and the same load shape. With `--rounds N` every column
runs N times, each round in a rotated order (see `radixkv.bench.serving.rounds`), and the table
aggregates each column over its rounds, so drifting background load does not favour a fixed
position.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from radixkv.bench.inputs.tokens import TokenSource
from radixkv.bench.inputs.trace_files import display_command
from radixkv.bench.inputs.workload_cli import (
    add_workload_args,
    build_workload,
    token_source,
    workloads_help,
)
from radixkv.bench.inputs.workloads import Workload
from radixkv.bench.serving.compare_table import markdown_table
from radixkv.bench.serving.rounds import merge_rounds, order_lines, round_orders
from radixkv.bench.serving.serve import add_client_args, run_workload
from radixkv.bench.serving.server_proc import CONFIG_HELP, CONFIGS, LocalServer, get_json

DEFAULT_CONFIGS = ("off", "radix", "radix-lpm", "radix-p16", "blockhash")


def machine_info() -> dict[str, Any]:
    """What this ran on, for reports: CPU model, cores, memory, OS, Python, torch."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib: float | None = None
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        mem_gib = round(pages * size / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    info: dict[str, Any] = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }
    if hasattr(os, "getloadavg"):
        info["loadavg"] = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    try:  # the version without importing torch (slow); the GPU only if torch is loaded
        info["torch"] = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        info["torch"] = None
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        info["cuda"] = torch.cuda.get_device_name(0)
    return info


def _resolve_model(model: str) -> tuple[str | None, str | None]:
    """(--model to pass to the server or None for its default, dir holding tokenizer.json)."""
    if model == "default":
        from radixkv.model.checkpoints.default import default_model_path

        return None, str(default_model_path())
    return model, model if (Path(model) / "tokenizer.json").is_file() else None


def _config_flags(name: str, server_args: list[str]) -> list[str]:
    return [*CONFIGS[name], *server_args]  # later flags win: --server-args can override CONFIGS


def _columns(args: argparse.Namespace) -> dict[str, str | None]:
    """Column name → URL of an extra server, or None for one of our configurations (in order)."""
    specs: list[tuple[str, str | None]] = [(c, None) for c in args.configs.split(",") if c]
    specs += [(n, u) for n, _, u in (e.partition("=") for e in args.extra or [])]
    cols: dict[str, str | None] = {}
    for name, url in specs:
        if url is None and name not in CONFIGS:
            raise SystemExit(f"unknown configuration {name!r}; known: {', '.join(CONFIGS)}")
        if not name or url == "" or name in cols:
            raise SystemExit(f"column {name!r}: empty, duplicated, or --extra without =URL")
        cols[name] = url
    return cols


def _run_one(
    args: argparse.Namespace,
    name: str,
    url: str | None,
    ctx: tuple[str | None, list[str], Path, Workload, TokenSource],
    log_name: str,
) -> dict[str, Any]:
    """One measured run of one column: a fresh server for our configurations (stopped after),
    the already-running one for an extra; either way its prefix cache is flushed after warm-up."""
    server_model, server_args, out, workload, tokens = ctx
    loadavg = " / ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else None
    if url is None:
        flags = _config_flags(name, server_args)
        print(f"[{name}] starting server: {' '.join(flags)}", file=sys.stderr)
        with LocalServer(server_model, flags, out / log_name, args.startup_timeout) as srv:
            res = run_workload(args, srv.url, None, workload, tokens)
            res["cache_stats"] = get_json(srv.url + "/cache/stats")
            res["server"] = {"kind": "radixkv", "flags": flags, "startup_s": srv.startup_s}
    else:
        print(f"[{name}] running against {url}", file=sys.stderr)
        res = run_workload(args, url, None, workload, tokens)
        version = get_json(url.rstrip("/") + "/version")  # vLLM and SGLang answer this
        res["server"] = {"kind": "extra", "url": url}
        if version and version.get("version"):
            res["server"]["version"] = str(version["version"])
    res["loadavg"] = loadavg
    return res


def run_compare(args: argparse.Namespace) -> dict[str, Any]:
    """Run every column (configuration or extra server) once per round, in each round's rotated
    order; the full result (JSON-ready), each column aggregated over its rounds."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    server_model, tok_dir = _resolve_model(args.model)
    if args.tokenizer is None:
        args.tokenizer = tok_dir
    tokens = token_source(args)
    workload = build_workload(args, tokens)
    ctx = (server_model, shlex.split(args.server_args or ""), out, workload, tokens)
    cols = _columns(args)
    machine = machine_info()  # before the runs: its load average is the one at the start
    order = round_orders(list(cols), args.rounds)
    per_round: dict[str, list[dict[str, Any]]] = {name: [] for name in cols}
    for r, names in enumerate(order):
        for pos, name in enumerate(names):
            if args.rounds > 1:
                print(f"round {r + 1}/{args.rounds}, run {pos + 1}/{len(names)}", file=sys.stderr)
            log = f"server-{name}.log" if args.rounds == 1 else f"server-{name}-r{r + 1}.log"
            res = _run_one(args, name, cols[name], ctx, log)
            per_round[name].append({**res, "round": r, "position": pos})
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": getattr(args, "command_line", None)
        or display_command(["radixkv", *sys.argv[1:]]),
        "model": args.model,
        "machine": machine,
        "workload": workload.describe(),
        "rounds": args.rounds,
        "order": order,
        "runs": {name: merge_rounds(per_round[name]) for name in cols},
    }


def draw_ttft_cdf(result: dict[str, Any], path: Path) -> Path:
    """The TTFT CDF of every run of a compare result, from its per-request records."""
    from radixkv.bench.plots import ttft_cdf

    ttfts = {
        n: [r["ttft_s"] for r in run["requests"] if r["ok"] and r["ttft_s"] is not None]
        for n, run in result["runs"].items()
    }
    wl, rounds = result["workload"], int(result.get("rounds") or 1)
    each = f" × {rounds} rounds" if rounds > 1 else ""
    return ttft_cdf(ttfts, path, f"TTFT CDF: {wl['name']}, {wl['num_requests']} requests{each}")


def write_outputs(
    result: dict[str, Any], out: Path, trace_plot: bool = True, replay_requests: int | None = None
) -> dict[str, str]:
    """Write compare.json, compare.md (the table) and the plots under `out`; their paths.

    For a trace workload, the hit-vs-capacity plot replays the trace offline (metadata only) over
    its first `replay_requests` requests (default: the same slice the servers were sent)."""
    from radixkv.bench.plots import trace_hit_vs_capacity

    out.mkdir(parents=True, exist_ok=True)
    runs = result["runs"]
    files: dict[str, str] = {}
    files["ttft_cdf"] = str(draw_ttft_cdf(result, out / "ttft_cdf.png"))
    wl = result["workload"]
    params = wl["params"]
    if trace_plot and wl["name"] == "trace" and params.get("trace"):
        rep = trace_hit_vs_capacity(
            params["trace"],
            max_requests=replay_requests or params.get("max_requests"),
            max_sessions=params.get("max_sessions"),
            path=out / "hit_vs_capacity.png",
        )
        result["trace_replay"] = rep
        files["hit_vs_capacity"] = rep["plot"]
    result["plots"] = files
    table = markdown_table({n: r["summary"] for n, r in runs.items()})
    order = "\n".join(f"- {line}" for line in order_lines(result.get("order") or []))
    (out / "compare.md").write_text(table + "\n\nRun order:\n\n" + order + "\n")
    (out / "compare.json").write_text(json.dumps(result, indent=1))
    files["json"] = str(out / "compare.json")
    files["table"] = str(out / "compare.md")
    return files


def _cmd_compare(args: argparse.Namespace) -> int:
    result = run_compare(args)
    files = write_outputs(result, Path(args.out), replay_requests=args.replay_requests)
    wl = result["workload"]
    print(f"\n{wl['name']}: {wl['num_requests']} requests, {wl['prompt_tokens']} prompt tokens")
    print(markdown_table({n: r["summary"] for n, r in result["runs"].items()}))
    print("\nrun order (each column aggregated over its rounds):")
    print("\n".join(order_lines(result["order"])))
    for kind, path in files.items():
        print(f"{kind}: {path}")
    return 0 if all(r["summary"]["completed"] for r in result["runs"].values()) else 1


def add_compare_args(
    p: argparse.ArgumentParser, out_help: str = "directory for JSON, table and plots"
) -> None:
    p.add_argument("--model", default="default", help="HF checkpoint dir, or 'default'")
    p.add_argument(
        "--configs",
        default=",".join(DEFAULT_CONFIGS),
        help="comma list of: " + "; ".join(f"{k} = {v}" for k, v in CONFIG_HELP.items()),
    )
    p.add_argument(
        "--extra",
        action="append",
        metavar="NAME=URL",
        help="an already-running OpenAI-compatible server to add as a column (repeatable)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every column N times, round r starting at column r mod K (rotated order), and "
        "aggregate each column over its rounds; use >= 2 on a machine with drifting load "
        "(default 1 for compare, 2 for scripts/report.py)",
    )
    p.add_argument("--server-args", default="", help="extra flags for every `radixkv serve`")
    p.add_argument(
        "--startup-timeout", type=float, default=600.0, help="seconds to wait for /health"
    )
    p.add_argument("--out", default="bench-results/compare", help=out_help)
    p.add_argument(
        "--replay-requests",
        type=int,
        default=None,
        help="trace: requests in the offline hit-vs-capacity replay (default: --max-requests)",
    )
    add_workload_args(p)
    add_client_args(p)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "compare",
        help="our server in several cache configurations (+ any other server), side by side",
        description=workloads_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_compare_args(p)
    p.set_defaults(func=_cmd_compare)

"""Write docs/benchmarks.md from `radixkv bench compare` results (never by hand).

    python scripts/report.py --from bench-results/shared-prefix/compare.json [--from ...]
        [--note TEXT] [--out docs/benchmarks.md]
    python scripts/report.py [compare flags]     # runs a compare itself first

Either runs a compare itself (CPU-sized shared-prefix defaults, the default model) or takes one
or more compare JSON files via --from; each becomes a section with its table, the exact command
that produced it, the workload, and its plots copied next to the markdown (PNG under docs/).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from radixkv.bench.inputs.trace_files import display_command
from radixkv.bench.inputs.workload_cli import workloads_help
from radixkv.bench.serving.compare import (
    add_compare_args,
    draw_ttft_cdf,
    run_compare,
    write_outputs,
)
from radixkv.bench.serving.compare_table import BASELINE, markdown_table, rounds_table
from radixkv.bench.serving.rounds import order_lines
from radixkv.bench.serving.server_proc import CONFIG_HELP

# CPU-sized defaults for the report's own run (shared-prefix: 8 groups × 4 prompts, 1024 + 64),
# two rounds in rotated order so drifting background load does not favour one column.
REPORT_DEFAULTS: dict[str, Any] = dict(
    rounds=2,
    configs="off,radix,radix-lpm,radix-p16,blockhash",
    workload="shared-prefix",
    num_groups=8,
    prompts_per_group=4,
    system_len=1024,
    question_len=64,
    output_len=16,
    concurrency=4,
)


def _machine_line(m: dict[str, Any]) -> str:
    parts = [f"{m.get('cpu')}", f"{m.get('cores')} logical cores"]
    if m.get("memory_gib"):
        parts.append(f"{m['memory_gib']} GiB RAM")
    if m.get("cuda"):
        parts.append(f"GPU {m['cuda']}")
    parts.append(f"{m.get('os')}, Python {m.get('python')}, torch {m.get('torch')}")
    return "; ".join(parts)


def _params_line(wl: dict[str, Any]) -> str:
    ps = ", ".join(f"{k}={v}" for k, v in wl["params"].items() if v is not None)
    return (
        f"`{wl['name']}` ({ps}), seed {wl['seed']}: {wl['num_requests']} requests, "
        f"{wl['prompt_tokens']} prompt tokens, ideal token hit rate "
        f"{wl['ideal_hit_rate'] * 100:.1f}%"
    )


def _columns(runs: dict[str, Any]) -> list[str]:
    lines = []
    for name, run in runs.items():
        srv = run.get("server", {})
        if srv.get("kind") == "radixkv":
            what = CONFIG_HELP.get(name, "")
            lines.append(f"- **{name}**: {what}; server flags `{' '.join(srv.get('flags', []))}`")
        else:
            ver = f", version {srv['version']}" if srv.get("version") else ""
            lines.append(
                f"- **{name}**: external server at {srv.get('url')} (model {run['model']}{ver})"
            )
    return lines


def headline(result: dict[str, Any]) -> str | None:
    """One sentence: the run with the lowest mean TTFT, against `off` (None without both)."""
    runs = {n: r["summary"] for n, r in result["runs"].items() if r["summary"]["completed"]}
    off = runs.get(BASELINE)
    timed = {n: s for n, s in runs.items() if n != BASELINE and s["ttft_s"]["mean"] is not None}
    if off is None or not timed or not off["ttft_s"]["mean"] or not off["output_tok_per_s"]:
        return None
    name, best = min(timed.items(), key=lambda kv: kv[1]["ttft_s"]["mean"])
    hit, ideal = best["token_hit_rate"], best["ideal_hit_rate"]
    return (
        f"**{name}** vs cache off: mean TTFT {off['ttft_s']['mean']:.2f} s → "
        f"{best['ttft_s']['mean']:.2f} s ({best['ttft_s']['mean'] / off['ttft_s']['mean']:.2f}×), "
        f"output throughput {best['output_tok_per_s'] / off['output_tok_per_s']:.2f}×"
        + (f", token hit rate {hit:.1%} (ideal {ideal:.1%})" if hit is not None and ideal else "")
        + "."
    )


def _load_line(result: dict[str, Any]) -> str | None:
    load = next((r.get("load") for r in result["runs"].values() if r.get("load")), None)
    if not load:
        return None
    if load.get("use_arrival_times"):
        shape = "the trace's own arrival times (scaled)"
    elif load.get("request_rate") is not None:
        shape = f"Poisson arrivals at {load['request_rate']} requests/s"
    else:
        shape = "all requests offered at once"
    if load.get("concurrency"):
        shape += f", at most {load['concurrency']} in flight"
    flushed = all(r.get("flushed_after_warmup") for r in result["runs"].values())
    then = ", then the server's prefix cache flushed" if flushed else ""
    each = " (before every measured run)" if (result.get("rounds") or 1) > 1 else ""
    return f"Load: {shape}; {load.get('warmup', 0)} unrelated warm-up requests first{then}{each}."


def _rounds_lines(result: dict[str, Any]) -> list[str]:
    """The order the columns actually ran in, and (several rounds) each round's mean TTFT."""
    order = result.get("order")
    if not order:
        return []
    n = len(order)
    if n > 1:
        head = (
            f"Run order: {n} rounds, each starting one column later than the last. Every "
            "column's figures above pool all its rounds: requests merged, token counts and wall "
            "times summed. Below the order, each round's mean TTFT per column, with its position "
            "in that round and the 1-minute load average when it started."
        )
    else:
        head = "Run order (a single round):"
    lines = [head, "", *(f"- {line}" for line in order_lines(order)), ""]
    if (table := rounds_table(result["runs"])) is not None:
        lines += [table, ""]
    return lines


def section(result: dict[str, Any], md_dir: Path, asset_dir: Path, tag: str) -> list[str]:
    """Markdown lines for one compare result; its PNGs are copied into `asset_dir`."""
    wl = result["workload"]
    trace = wl["params"].get("trace")
    lines = [f"## {wl['name']}" + (f": {Path(trace).name}" if trace else ""), ""]
    if (line := headline(result)) is not None:
        lines += [line, ""]
    machine = result["machine"]
    lines += [f"Run {result['created']} on: {_machine_line(machine)}.", ""]
    if machine.get("loadavg"):
        lines += [
            f"Machine load average at the start (1/5/15 min): {machine['loadavg']} — on a "
            "shared machine, compare columns within a table rather than across runs.",
            "",
        ]
    lines += [f"Workload: {_params_line(wl)}.", ""]
    if (line := _load_line(result)) is not None:
        lines += [line, ""]
    lines += ["Columns:", "", *_columns(result["runs"]), ""]
    lines += [markdown_table({n: r["summary"] for n, r in result["runs"].items()}), ""]
    lines += [
        "Ratios are against `off` (TTFT: below 1 is faster; throughput: above 1 is more). "
        "Hit rates are the servers' own `cached_tokens` ÷ `prompt_tokens`.",
        "",
        *_rounds_lines(result),
        "Produced by:",
        "",
        "```",
        result["command"],
        "```",
        "",
    ]
    # The TTFT CDF is redrawn from the per-request records; other plots are copied if present.
    images = [("ttft_cdf", draw_ttft_cdf(result, asset_dir / f"{tag}-ttft_cdf.png"))]
    for kind, src in (result.get("plots") or {}).items():
        if kind == "ttft_cdf" or not str(src).endswith(".png") or not Path(src).is_file():
            continue
        dst = asset_dir / f"{tag}-{kind}.png"
        if Path(src).resolve() != dst.resolve():
            shutil.copyfile(src, dst)
        images.append((kind, dst))
    for kind, img in images:
        rel = img.relative_to(md_dir) if img.is_relative_to(md_dir) else img
        lines += [f"![{kind}]({rel.as_posix()})", ""]
    return lines


def render(
    results: list[dict[str, Any]],
    md_path: Path,
    report_command: str,
    notes: list[str] | None = None,
) -> str:
    md_dir = md_path.parent
    asset_dir = md_dir / "benchmarks"
    asset_dir.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by `python scripts/report.py`; do not edit by hand. -->",
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by:",
        "",
        "```",
        report_command,
        "```",
        "",
        "Every column runs the same seeded workload (identical prompt token ids) through the "
        "same streaming client (`radixkv bench serve`): TTFT is send → first streamed text, "
        "TPOT is (end − first token) ÷ (output tokens − 1), effective input tokens/s counts "
        "every prompt token, cached or not, over the wall time. Any other OpenAI-compatible "
        "engine started on the same checkpoint joins as a column with `--extra NAME=URL`.",
        "",
    ]
    if notes:
        lines += ["Notes:", "", *(f"- {n}" for n in notes), ""]
    for i, res in enumerate(results):
        tag = f"{i}-{res['workload']['name']}"
        lines += section(res, md_dir, asset_dir, tag)
    text = "\n".join(lines).rstrip() + "\n"
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(text)
    return text


REPORT_COMMAND = ["python", "scripts/report.py"]


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """Render the compare results named by --from (or of a compare run now) into args.out."""
    md_path = Path(args.out)
    command = display_command([*REPORT_COMMAND, *argv])
    results: list[dict[str, Any]] = []
    if args.from_json:
        results = [json.loads(Path(p).read_text()) for p in args.from_json]
    else:
        args.command_line = command
        args.out = str(Path(args.work_dir))
        result = run_compare(args)
        write_outputs(result, Path(args.work_dir), replay_requests=args.replay_requests)
        results = [result]
    render(results, md_path, command, args.note)
    print(f"wrote {md_path}")
    return 0


def parser() -> argparse.ArgumentParser:
    """The report's flags: every `radixkv bench compare` flag, with CPU-sized defaults."""
    p = argparse.ArgumentParser(
        prog="python scripts/report.py",
        description=workloads_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_compare_args(p, out_help="the markdown file to write (plots go next to it)")
    p.set_defaults(**REPORT_DEFAULTS)
    p.set_defaults(out="docs/benchmarks.md")
    p.add_argument("--from", dest="from_json", action="append", help="compare.json (repeatable)")
    p.add_argument("--note", action="append", help="a line for the Notes list (repeatable)")
    p.add_argument("--work-dir", default="bench-results/report", help="compare run output dir")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run(parser().parse_args(argv), argv)


if __name__ == "__main__":
    sys.exit(main())

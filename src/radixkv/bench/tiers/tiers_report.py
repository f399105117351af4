"""The table and the plot of `radixkv bench tiers` (radixkv.bench.tiers.cli), from its results JSON,
so a saved run can be re-rendered: `format_table(json.load(f))`, `plot_rounds(doc, path)`."""

from __future__ import annotations

from typing import Any


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{1000 * v:.0f}"


def error_line(text: str) -> str:
    """The last non-empty line of a mode's error (the server's own message when it refused)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    last = lines[-1] if lines else "no rounds"
    return last.split(" ERROR ", 1)[-1][-200:]


def _finished(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: m for k, m in results["modes"].items() if m.get("rounds")}


def _longest(modes: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = max((m["rounds"] for m in modes.values()), key=len)
    return rows


def _cell(rows: list[dict[str, Any]], i: int) -> str:
    """One mode's round i as "hit, tok/s" ("-" past the rounds a partial mode measured)."""
    if i >= len(rows):
        return "-"
    return f"{_pct(rows[i]['token_hit_rate'])}, {rows[i]['effective_input_tok_per_s']:,.0f}"


def round_lines(results: dict[str, Any]) -> list[str]:
    """Per round: the ideal hit rate, then each finished mode's hit rate and effective tok/s."""
    modes = _finished(results)
    if not modes:
        return []
    head = f"{'round':>5} {'prompt tok':>10} {'ideal':>6}"
    head += "".join(f" | {name + ' hit, tok/s':>24}" for name in modes)
    lines = [head]
    for i, row in enumerate(_longest(modes)):
        line = f"{row['round']:>5} {row['sent_prompt_tokens']:>10} {_pct(row['ideal_hit_rate']):>6}"
        for m in modes.values():
            line += f" | {_cell(m['rounds'], i):>24}"
        lines.append(line)
    return lines


def summary_lines(results: dict[str, Any]) -> list[str]:
    """Per mode: effective input tok/s and its ratio to L1, hit rates (all rounds and the last
    third, each with its ideal), mean TTFT/TPOT, hits by tier; failed modes with their error."""
    speed = results.get("speedup_vs_L1", {})
    head = (
        f"{'mode':<9} {'eff. input tok/s':>16} {'vs L1':>6} {'hit (ideal)':>15} "
        f"{'last rounds hit (ideal)':>24} {'TTFT ms':>8} {'TPOT ms':>8}  device/host/storage hits"
    )
    lines = [head]
    for name, m in results["modes"].items():
        if not m.get("summary"):
            lines.append(f"{name:<9} failed: {error_line(m.get('error', ''))}")
            continue
        s, rows = m["summary"], m["rounds"]
        a, b = s["last_rounds"]
        hits = {t: sum(r["hits_by_tier"].get(t, 0) for r in rows) for t in ("device", "host")}
        hits["storage"] = sum(r["hits_by_tier"].get("storage", 0) for r in rows)
        ttft = _mean([r["ttft_mean_s"] for r in rows])
        tpot = _mean([r["tpot_mean_s"] for r in rows])
        ratio = f"{speed[name]:.2f}x" if name in speed else "-"
        whole = f"{_pct(s['token_hit_rate'])} ({_pct(s['ideal_hit_rate'])})"
        last = f"r{a}-{b}: {_pct(s['last_hit_rate'])} ({_pct(s['last_ideal_hit_rate'])})"
        lines.append(
            f"{name:<9} {s['effective_input_tok_per_s']:>16.0f} {ratio:>6} {whole:>15} "
            f"{last:>24} {_ms(ttft):>8} {_ms(tpot):>8}  "
            f"{hits['device']}/{hits['host']}/{hits['storage']}"
        )
    return lines


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def format_table(results: dict[str, Any]) -> str:
    sh = results["shape"]
    lines = [
        f"model {results['model']}, {sh['clients']} clients x {sh['rounds']} rounds x "
        f"({sh['turn_len']} new + {sh['output_len']} out), {sh['concurrency']} in flight, "
        f"page {results['page_size']}, working set {results['working_set_tokens']} tokens, "
        f"ideal speedup {results['ideal_speedup']:.1f}x",
        "",
        *round_lines(results),
        "",
        *summary_lines(results),
    ]
    rs = results.get("restart")
    if rs and "error" in rs:
        lines += ["", f"restart: failed: {rs['error'][-200:]!r}"]
    elif rs:
        lines += [
            "",
            f"restart, {rs['prefix_len']}-token prefix: TTFT without L3 "
            f"{_ms(rs['without_l3']['ttft_s'])} ms (cached {rs['without_l3']['cached_tokens']}), "
            f"with L3 {_ms(rs['with_l3']['ttft_s'])} ms (cached {rs['with_l3']['cached_tokens']}): "
            f"{rs['speedup']:.2f}x",
        ]
    return "\n".join(lines)


def plot_rounds(results: dict[str, Any], path: str) -> None:
    """Two panels: token hit rate per round (each mode, the ideal dashed) and effective input
    throughput per round (each mode)."""
    from radixkv.bench.plots import pyplot

    plt = pyplot()
    modes = _finished(results)
    fig, (ax_hit, ax_tput) = plt.subplots(1, 2, figsize=(10, 4))
    for name, m in modes.items():
        xs = [r["round"] for r in m["rounds"]]
        ax_hit.plot(xs, [100 * r["token_hit_rate"] for r in m["rounds"]], "o-", label=name)
        ax_tput.plot(xs, [r["effective_input_tok_per_s"] for r in m["rounds"]], "o-", label=name)
    if modes:
        rows = _longest(modes)
        xs = [r["round"] for r in rows]
        ax_hit.plot(xs, [100 * r["ideal_hit_rate"] for r in rows], "k--", label="ideal")
    sh = results["shape"]
    title = (
        f"{sh['clients']} clients x {sh['rounds']} rounds, L1 = {sh['l1_frac']:.2f} x working set"
    )
    ax_hit.set(xlabel="round", ylabel="token hit rate (%)", title="hit rate per round")
    ax_tput.set(xlabel="round", ylabel="prompt tokens / s", title="effective input throughput")
    ax_tput.set_yscale("log")
    for ax in (ax_hit, ax_tput):
        ax.grid(True, alpha=0.3)
        if modes:
            ax.legend(fontsize=8)
    fig.suptitle(f"{results['model']}: {title}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(results: dict[str, Any]) -> str:
    """The summary and the per-round hit rates as markdown tables (for the docs)."""
    speed = results.get("speedup_vs_L1", {})
    out = [
        "| mode | effective input tok/s | vs L1 | hit rate (ideal) | last rounds: hit (ideal) "
        "| mean TTFT | mean TPOT | hits device / host / storage |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, m in results["modes"].items():
        if not m.get("summary"):
            out.append(f"| {name} | failed: {error_line(m.get('error', ''))} |||||||")
            continue
        s, rows = m["summary"], m["rounds"]
        hits = [
            sum(r["hits_by_tier"].get(t, 0) for r in rows) for t in ("device", "host", "storage")
        ]
        a, b = s["last_rounds"]
        ratio = f"{speed[name]:.2f}×" if name in speed else "-"
        out.append(
            f"| {name} | {s['effective_input_tok_per_s']:,.0f} | {ratio} | "
            f"{_pct(s['token_hit_rate'])} ({_pct(s['ideal_hit_rate'])}) | rounds {a}–{b}: "
            f"{_pct(s['last_hit_rate'])} ({_pct(s['last_ideal_hit_rate'])}) | "
            f"{_ms(_mean([r['ttft_mean_s'] for r in rows]))} ms | "
            f"{_ms(_mean([r['tpot_mean_s'] for r in rows]))} ms | "
            f"{hits[0]:,} / {hits[1]:,} / {hits[2]:,} |"
        )
    modes = _finished(results)
    if modes:
        out += ["", "| round | ideal | " + " | ".join(modes) + " |"]
        out.append("|---" * (2 + len(modes)) + "|")
        for i, row in enumerate(_longest(modes)):
            cells = [_cell(m["rounds"], i) for m in modes.values()]
            out.append(
                f"| {row['round']} | {_pct(row['ideal_hit_rate'])} | " + " | ".join(cells) + " |"
            )
    return "\n".join(out)


if __name__ == "__main__":  # python -m radixkv.bench.tiers.tiers_report RESULTS.json [--markdown]
    import json
    import sys
    from pathlib import Path

    doc = json.loads(Path(sys.argv[1]).read_text())
    print(markdown(doc) if "--markdown" in sys.argv else format_table(doc))

"""The side-by-side table of `radixkv bench peers` (kept apart from the runner so it can be
regenerated from a saved JSON)."""

from __future__ import annotations

from typing import Any


def _vllm_metrics(r: dict[str, Any]) -> dict[str, float | None]:
    return {
        "duration (s)": r.get("duration"),
        "mean TTFT (ms)": r.get("mean_ttft_ms"),
        "mean TPOT (ms)": r.get("mean_tpot_ms"),
        "output tok/s": r.get("output_throughput"),
    }


def _our_metrics(r: dict[str, Any]) -> dict[str, float | None]:
    s = r["summary"]

    def ms(v: float | None) -> float | None:
        return None if v is None else v * 1000

    return {
        "duration (s)": s.get("wall_s"),
        "mean TTFT (ms)": ms(s["ttft_s"]["mean"]),
        "mean TPOT (ms)": ms(s["tpot_s"]["mean"]),
        "output tok/s": s.get("output_tok_per_s"),
        "token hit rate": s.get("token_hit_rate"),
    }


def _fmt(v: float | None, pct: bool = False) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if pct else f"{v:,.1f}"


def peers_table(result: dict[str, Any]) -> str:
    """Rows: workload x client x dtype x metric; columns: each engine, then radixkv / vllm."""
    runs = result["runs"]
    engines = list(dict.fromkeys(r["engine"] for r in runs))
    by = {(r["engine"], r["dtype"]): r for r in runs}
    dtypes = list(dict.fromkeys(r["dtype"] for r in runs))
    workloads = [k for k in result["workloads"] if any(k in r for r in runs)]
    ratio = len(engines) == 2 and "radixkv" in engines
    head = ["workload", "client", "dtype", "metric", *engines]
    head += ["radixkv / vllm"] if ratio else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for wl in workloads:
        for client, metrics in (("vllm_client", _vllm_metrics), ("radixkv_client", _our_metrics)):
            for dt in dtypes:
                vals = {e: metrics(by[(e, dt)][wl][client]) for e in engines if (e, dt) in by}
                names = next(iter(vals.values())).keys() if vals else []
                for m in names:
                    pct = m == "token hit rate"
                    row = [wl, client.replace("_client", ""), dt, m]
                    row += [_fmt(vals[e].get(m), pct) if e in vals else "-" for e in engines]
                    if ratio:
                        a, b = (vals.get(e, {}).get(m) for e in engines)
                        r = a / b if a and b and not pct else None
                        row.append("-" if r is None else f"{r:.2f}x")
                    lines.append("| " + " | ".join(row) + " |")
    started = [f"- {r['engine']} {r['dtype']}: `{r['server']['command']}`" for r in runs]
    return "\n".join(lines) + "\n\nHow each server was started:\n\n" + "\n".join(started)

"""The side-by-side table of `python -m scripts.peers` (kept apart from the runner so it can be
regenerated from a saved JSON)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

Metrics = Callable[[dict[str, Any]], dict[str, float | None]]


def _peer_e2e_ms(r: dict[str, Any]) -> float | None:
    """Mean end-to-end request latency: SGLang's client reports it; vLLM's keeps each request's
    latency (seconds), and its mean only with `--percentile-metrics e2el`."""
    for key in ("mean_e2el_ms", "mean_e2e_latency_ms"):
        if r.get(key) is not None:
            return float(r[key])
    lat = r.get("latencies")
    return 1000 * statistics.mean(lat) if lat else None


def _peer_metrics(r: dict[str, Any]) -> dict[str, float | None]:
    """vLLM's and SGLang's clients name their results alike."""
    return {
        "duration (s)": r.get("duration"),
        "mean TTFT (ms)": r.get("mean_ttft_ms"),
        "p99 TTFT (ms)": r.get("p99_ttft_ms"),
        "mean TPOT (ms)": r.get("mean_tpot_ms"),
        "mean E2E latency (ms)": _peer_e2e_ms(r),
        "output tok/s": r.get("output_throughput"),
    }


def _our_metrics(r: dict[str, Any]) -> dict[str, float | None]:
    s = r["summary"]

    def ms(v: float | None) -> float | None:
        return None if v is None else v * 1000

    return {
        "duration (s)": s.get("wall_s"),
        "mean TTFT (ms)": ms(s["ttft_s"]["mean"]),
        "p99 TTFT (ms)": ms(s["ttft_s"].get("p99")),
        "mean TPOT (ms)": ms(s["tpot_s"]["mean"]),
        "mean E2E latency (ms)": ms(s.get("e2e_s", {}).get("mean")),
        "output tok/s": s.get("output_tok_per_s"),
        "token hit rate": s.get("token_hit_rate"),
    }


def _fmt(v: float | None, pct: bool = False) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if pct else f"{v:,.1f}"


def _medians(runs: list[dict[str, Any]], wl: str, client: str, metrics: Metrics) -> dict:
    """Each metric's median over the rounds of one (engine, dtype)."""
    per_round = [metrics(r[wl][client]) for r in runs if client in r.get(wl, {})]
    if not per_round:
        return {}
    out: dict[str, float | None] = {}
    for name in per_round[0]:
        vals = [v for m in per_round if (v := m[name]) is not None]
        out[name] = statistics.median(vals) if vals else None
    return out


def machine_line(result: dict[str, Any]) -> str:
    """What the run measured on: the CPU, cores and memory, and the kernel paths each of our
    engines' server reported (empty for a result that records neither)."""
    parts = []
    m = result.get("machine") or {}
    if m:
        parts.append(f"Machine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('memory_gib')} GiB.")
    for engine, paths in (result.get("kernel_paths") or {}).items():
        said = ", ".join(f"{k} {v}" for k, v in (paths or {}).items() if k != "cpu")
        parts.append(f"{engine} kernel paths: {said or 'not reported'}.")
    return " ".join(parts)


def peers_table(result: dict[str, Any]) -> str:
    """Rows: workload x client x dtype x metric; columns: each engine, then radixkv / vllm.
    With several rounds every cell is the median over them. Preceded by `machine_line`."""
    runs = result["runs"]
    engines = list(dict.fromkeys(r["engine"] for r in runs))
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault((r["engine"], r["dtype"]), []).append(r)
    dtypes = list(dict.fromkeys(r["dtype"] for r in runs))
    workloads = [k for k in result["workloads"] if any(k in r for r in runs)]
    # One ratio column per engine of ours against vLLM (or the one other engine).
    base = "vllm" if "vllm" in engines else (engines[1] if len(engines) == 2 else None)
    ours = [e for e in engines if e.startswith("radixkv") and e != base] if base else []
    head = ["workload", "client", "dtype", "metric", *engines]
    head += [f"{e} / {base}" for e in ours]
    header = machine_line(result)
    lines = [header, ""] if header else []
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for wl in workloads:
        clients = list(result["workloads"][wl] or ("vllm_client", "radixkv_client"))
        for client in clients:
            metrics = _our_metrics if client == "radixkv_client" else _peer_metrics
            for dt in dtypes:
                vals = {
                    e: _medians(by[(e, dt)], wl, client, metrics) for e in engines if (e, dt) in by
                }
                names = list(dict.fromkeys(k for v in vals.values() for k in v))
                for m in names:
                    pct = m == "token hit rate"
                    row = [wl, client.replace("_client", ""), dt, m]
                    row += [_fmt(vals[e].get(m), pct) if e in vals else "-" for e in engines]
                    b = vals.get(base, {}).get(m) if base else None
                    for e in ours:
                        a = vals.get(e, {}).get(m)
                        r = a / b if a and b and not pct else None
                        row.append("-" if r is None else f"{r:.2f}x")
                    lines.append("| " + " | ".join(row) + " |")
    rounds = max(len(v) for v in by.values()) if by else 0
    note = (
        f"\n\nEvery cell is the median of {rounds} rounds (a fresh server each, the engines' "
        "order rotated from round to round)."
        if rounds > 1
        else ""
    )
    firsts = [v[0] for v in by.values()]
    started = [f"- {r['engine']} {r['dtype']}: `{r['server']['command']}`" for r in firsts]
    return "\n".join(lines) + note + "\n\nHow each server was started:\n\n" + "\n".join(started)

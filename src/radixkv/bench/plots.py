"""The benchmarks' plots (matplotlib, Agg): hit rate vs capacity per policy (`radixkv replay
--plot`, and `bench compare` on a trace), TTFT CDF per run (`bench compare`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixkv.bench.replay import TraceReport


def pyplot() -> Any:
    """matplotlib.pyplot on the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")  # headless; must precede the pyplot import
    import matplotlib.pyplot as plt

    return plt


def ttft_cdf(
    runs: Mapping[str, Sequence[float]], path: str | Path, title: str = "TTFT distribution"
) -> Path:
    """One empirical CDF of TTFT (seconds in, milliseconds shown, log x) per run."""
    import numpy as np

    plt = pyplot()
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, values in runs.items():
        if not values:
            continue
        n = len(values)
        xs = np.sort(np.asarray(values, dtype=np.float64)) * 1000.0
        ys = np.arange(1, n + 1) / n
        xs, ys = np.concatenate([xs[:1], xs]), np.concatenate([[0.0], ys])  # rise from 0
        ax.step(xs, ys, where="post", label=f"{name} (n={n})")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("time to first token (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def trace_hit_vs_capacity(
    trace: str,
    *,
    max_requests: int | None,
    max_sessions: int | None,
    path: str | Path,
    caches: Sequence[str] = ("radix", "blockhash"),
) -> dict[str, Any]:
    """Offline replay of the trace (metadata only, `radixkv.bench.replay`) at several capacities
    per cache design, plotted as hit rate vs capacity; returns the replay reports as JSON."""
    from radixkv.bench.inputs.trace_files import display_path, resolve_trace
    from radixkv.bench.inputs.traces import load_trace
    from radixkv.bench.replay import replay_grid

    resolved = resolve_trace(trace)
    trace = display_path(resolved)
    reqs = load_trace(resolved, max_sessions=max_sessions)
    if max_requests is not None:
        reqs = reqs[:max_requests]
    reports = [replay_grid(trace, reqs, cache_kind=c, policies=("lru",)) for c in caches]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot_hit_rates(reports, out)
    return {"plot": str(out), "reports": [r.to_dict() for r in reports]}


def plot_hit_rates(reports: Sequence[TraceReport | dict[str, Any]], path: str | Path) -> None:
    """Write a PNG: token hit rate vs capacity (log x) per policy; the ideal as a dashed grey
    line, oracles (belady) dashed in black and labelled as such. Takes reports or their JSON
    form (`TraceReport.to_dict()`), so a saved `replay --json` can be re-plotted."""
    plt = pyplot()
    docs = [r if isinstance(r, dict) else r.to_dict() for r in reports]
    n = max(len(docs), 1)
    fig, axes = plt.subplots(1, n, figsize=(6 * n, 4.2), squeeze=False)
    for ax, rep in zip(axes[0], docs, strict=False):
        results = [r for r in rep["results"] if r["capacity"] is not None]
        for pol in sorted({r["policy"] for r in results}):
            runs = sorted((r for r in results if r["policy"] == pol), key=lambda r: r["capacity"])
            xs = [r["capacity"] for r in runs]
            ys = [100.0 * r["token_hit_rate"] for r in runs]
            if any(r.get("oracle") for r in runs):
                ax.plot(xs, ys, "k--", marker="o", label=f"{pol} (oracle)")
            else:
                ax.plot(xs, ys, marker="o", label=pol)
        ideal = 100.0 * rep["ideal"]["token_hit_rate"]
        ax.axhline(ideal, ls=":", color="grey", label="ideal (∞)")
        ax.set_xscale("log")
        ax.set_xlabel("cache capacity (tokens)")
        ax.set_ylabel("token hit rate (%)")
        title = f"{Path(rep['path']).name}\n{rep['cache']}, page {rep['page_size']}"
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

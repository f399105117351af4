"""Plots of `bench compare` (matplotlib, Agg): TTFT CDF per run; hit rate vs capacity (traces)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # headless; must precede the pyplot import
    import matplotlib.pyplot as plt

    return plt


def ttft_cdf(
    runs: Mapping[str, Sequence[float]], path: str | Path, title: str = "TTFT distribution"
) -> Path:
    """One empirical CDF of TTFT (seconds in, milliseconds shown, log x) per run."""
    import numpy as np

    plt = _pyplot()
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
    from radixkv.bench.plot import plot_hit_rates
    from radixkv.bench.replay import replay_grid
    from radixkv.bench.trace_files import display_path, resolve_trace
    from radixkv.bench.traces import load_trace

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

"""Hit rate vs cache capacity, one line per policy and one panel per trace (matplotlib, Agg)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixkv.bench.replay import TraceReport


def plot_hit_rates(reports: Sequence[TraceReport], path: str | Path) -> None:
    """Write a PNG: token hit rate vs capacity (log x) per policy; the ideal as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")  # headless; set before pyplot is imported
    import matplotlib.pyplot as plt

    n = max(len(reports), 1)
    fig, axes = plt.subplots(1, n, figsize=(6 * n, 4.2), squeeze=False)
    for ax, rep in zip(axes[0], reports, strict=False):
        policies = sorted({r.policy for r in rep.results})
        for pol in policies:
            runs = sorted(
                (r for r in rep.results if r.policy == pol and r.capacity is not None),
                key=lambda r: r.capacity or 0,
            )
            xs = [r.capacity for r in runs]
            ys = [100.0 * r.token_hit_rate for r in runs]
            ax.plot(xs, ys, marker="o", label=pol)
        ax.axhline(100.0 * rep.ideal.token_hit_rate, ls="--", color="grey", label="ideal (∞)")
        ax.set_xscale("log")
        ax.set_xlabel("cache capacity (tokens)")
        ax.set_ylabel("token hit rate (%)")
        ax.set_title(f"{Path(rep.path).name}\n{rep.cache}, page {rep.page_size}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

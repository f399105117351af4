"""Hit rate vs cache capacity, one line per policy and one panel per trace (matplotlib, Agg)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixkv.bench.replay import TraceReport


def plot_hit_rates(reports: Sequence[TraceReport | dict[str, Any]], path: str | Path) -> None:
    """Write a PNG: token hit rate vs capacity (log x) per policy; the ideal as a dashed grey
    line, oracles (belady) dashed in black and labelled as such. Takes reports or their JSON
    form (`TraceReport.to_dict()`), so a saved `replay --json` can be re-plotted."""
    import matplotlib

    matplotlib.use("Agg")  # headless; set before pyplot is imported
    import matplotlib.pyplot as plt

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

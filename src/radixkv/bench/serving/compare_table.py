"""The side-by-side table of `bench compare` (markdown: readable in a terminal and in docs)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

BASELINE = "off"

Getter = Callable[[dict[str, Any]], float | None]


def _get(*path: str) -> Getter:
    def get(s: dict[str, Any]) -> float | None:
        v: Any = s
        for k in path:
            if not isinstance(v, dict):
                return None
            v = v.get(k)
        return None if v is None else float(v)

    return get


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


# (label, getter, formatter); latencies are seconds in the summary, shown in ms.
ROWS: tuple[tuple[str, Getter, Callable[[float | None], str]], ...] = (
    ("TTFT mean (ms)", _get("ttft_s", "mean"), _ms),
    ("TTFT p50 (ms)", _get("ttft_s", "p50"), _ms),
    ("TTFT p90 (ms)", _get("ttft_s", "p90"), _ms),
    ("TTFT p99 (ms)", _get("ttft_s", "p99"), _ms),
    ("TPOT mean (ms)", _get("tpot_s", "mean"), _ms),
    ("TPOT p50 (ms)", _get("tpot_s", "p50"), _ms),
    ("TPOT p99 (ms)", _get("tpot_s", "p99"), _ms),
    ("E2E mean (ms)", _get("e2e_s", "mean"), _ms),
    ("E2E p50 (ms)", _get("e2e_s", "p50"), _ms),
    ("E2E p99 (ms)", _get("e2e_s", "p99"), _ms),
    ("output tokens/s", _get("output_tok_per_s"), _num),
    ("effective input tokens/s", _get("input_tok_per_s"), _num),
    ("requests/s", _get("requests_per_s"), lambda v: "-" if v is None else f"{v:.3f}"),
    ("token hit rate (server)", _get("token_hit_rate"), _pct),
    ("ideal hit rate", _get("ideal_hit_rate"), _pct),
    ("wall time (s)", _get("wall_s"), lambda v: "-" if v is None else f"{v:.1f}"),
)

# (label, getter): shown as the run's value ÷ the baseline's (TTFT: < 1 is better; rates: > 1).
RATIOS: tuple[tuple[str, Getter], ...] = (
    ("TTFT mean ÷ off", _get("ttft_s", "mean")),
    ("TTFT p50 ÷ off", _get("ttft_s", "p50")),
    ("output tokens/s ÷ off", _get("output_tok_per_s")),
    ("effective input tokens/s ÷ off", _get("input_tok_per_s")),
)


def ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return value / base


def table_rows(summaries: Mapping[str, dict[str, Any]]) -> list[list[str]]:
    """Header + rows: one column per run (in the mapping's order), ratios against `off`."""
    names = list(summaries)
    rows = [["metric", *names]]
    for label, get, fmt in ROWS:
        rows.append([label, *(fmt(get(summaries[n])) for n in names)])
    ok = [f"{summaries[n]['completed']} / {summaries[n]['errors']}" for n in names]
    rows.append(["completed / errors", *ok])
    base = summaries.get(BASELINE)
    if base is not None:
        for label, get in RATIOS:
            cells = []
            for n in names:
                r = ratio(get(summaries[n]), get(base))
                cells.append("-" if r is None else f"{r:.2f}×")
            rows.append([label, *cells])
    return rows


def markdown_table(summaries: Mapping[str, dict[str, Any]]) -> str:
    return _render(table_rows(summaries))


def _render(rows: list[list[str]]) -> str:
    """Markdown with padded columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def line(cells: list[str]) -> str:
        padded = [c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(cells)]
        return "| " + " | ".join(padded) + " |"

    sep = (
        "|"
        + "|".join("-" * (w + 2) if i == 0 else "-" * (w + 1) + ":" for i, w in enumerate(widths))
        + "|"
    )
    return "\n".join([line(rows[0]), sep, *(line(r) for r in rows[1:])])


def rounds_table(runs: Mapping[str, dict[str, Any]]) -> str | None:
    """Mean TTFT of every column in every round, with its position in that round's run order
    (#1 = ran first) and the 1-minute load average when it started, so drift between rounds is
    visible; None for single-round results."""
    per_col = {n: run.get("rounds") or [] for n, run in runs.items()}
    n_rounds = max((len(r) for r in per_col.values()), default=0)
    if n_rounds < 2:
        return None
    rows = [["mean TTFT (ms) by round", *(f"round {i + 1}" for i in range(n_rounds))]]
    for name, rounds in per_col.items():
        cells = ["-"] * n_rounds
        for rd in rounds:
            mean = _get("ttft_s", "mean")(rd["summary"])
            load = str(rd.get("loadavg") or "").split(" / ")[0]
            extra = f", load {load}" if load else ""
            cells[rd["round"]] = f"{_ms(mean)} (#{rd['position'] + 1}{extra})"
        rows.append([name, *cells])
    return _render(rows)

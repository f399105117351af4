"""Summaries of a serving run: latency percentiles, throughputs and the token hit rate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from radixkv.bench.serving.client import RequestResult


def _stats(values: Sequence[float], pcts: Sequence[int]) -> dict[str, float | None]:
    out: dict[str, float | None] = {"mean": None}
    out.update({f"p{p}": None for p in pcts})
    if values:
        arr = np.asarray(values, dtype=np.float64)
        out["mean"] = float(arr.mean())
        for p in pcts:
            out[f"p{p}"] = float(np.percentile(arr, p))
    return out


def summarize(
    results: Sequence[RequestResult],
    wall_s: float,
    ideal_hit_rate: float | None = None,
    not_sent: int = 0,
) -> dict[str, Any]:
    """The numbers of one run. Throughputs count successful requests only, over the wall time.

    `token_hit_rate` is sum(cached_tokens) / sum(prompt_tokens) over successful requests, as the
    server reported them (None when the server reported no usage at all).
    """
    ok = [r for r in results if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    output = sum(r.output_tokens for r in ok)
    wall = max(wall_s, 1e-9)
    reported = any(r.usage_reported for r in ok)
    return {
        "completed": len(ok),
        "errors": len(results) - len(ok),
        "not_sent": not_sent,
        "wall_s": wall_s,
        "ttft_s": _stats([r.ttft_s for r in ok if r.ttft_s is not None], (50, 90, 99)),
        "tpot_s": _stats([r.tpot_s for r in ok if r.tpot_s is not None], (50, 99)),
        "e2e_s": _stats([r.e2e_s for r in ok if r.e2e_s is not None], (50, 99)),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "output_tokens": output,
        "output_tok_per_s": output / wall,
        "input_tok_per_s": prompt / wall,
        "requests_per_s": len(ok) / wall,
        "token_hit_rate": (cached / prompt if prompt else 0.0) if reported else None,
        "ideal_hit_rate": ideal_hit_rate,
        "first_errors": [r.error for r in results if not r.ok][:5],
    }


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def summary_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of one summary, in display order."""
    t, tp, e = s["ttft_s"], s["tpot_s"], s["e2e_s"]
    return [
        ("completed / errors / not sent", f"{s['completed']} / {s['errors']} / {s['not_sent']}"),
        ("wall time (s)", f"{s['wall_s']:.2f}"),
        (
            "TTFT mean / p50 / p90 / p99 (ms)",
            " / ".join(_ms(t[k]) for k in ("mean", "p50", "p90", "p99")),
        ),
        ("TPOT mean / p50 / p99 (ms)", " / ".join(_ms(tp[k]) for k in ("mean", "p50", "p99"))),
        ("E2E mean / p50 / p99 (ms)", " / ".join(_ms(e[k]) for k in ("mean", "p50", "p99"))),
        ("output tokens/s", f"{s['output_tok_per_s']:.1f}"),
        ("effective input tokens/s", f"{s['input_tok_per_s']:.1f}"),
        ("requests/s", f"{s['requests_per_s']:.3f}"),
        (
            "token hit rate (server) / ideal",
            f"{_pct(s['token_hit_rate'])} / {_pct(s['ideal_hit_rate'])}",
        ),
    ]


def format_summary(s: dict[str, Any], title: str = "") -> str:
    rows = summary_rows(s)
    width = max(len(k) for k, _ in rows)
    lines = [title] if title else []
    lines += [f"{k.ljust(width)}  {v}" for k, v in rows]
    return "\n".join(lines)

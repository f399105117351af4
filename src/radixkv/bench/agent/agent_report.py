"""What `radixkv bench agent` reports: per-turn cache hits and latencies, the target's check, TTFT
against the history's length, and two engines side by side.

Hit rate of a turn = cached / prompt tokens, as the server reported them in `usage`
(`prompt_tokens_details.cached_tokens`). Reusable = what a cache holding the session's previous
prompt and its answer could serve: min(prompt, previous prompt + previous completion) tokens (an
estimate: it assumes the answer re-renders to the tokens that were generated). Computed = prompt -
cached: the prefill a turn really paid for. Rates over several turns are pooled (sums of tokens),
not means of rates.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from radixkv.bench.agent.agent_session import TurnRecord

HIT_TARGET = 0.95  # every turn after the first serves >= 95% of its prompt from the cache


def _mean(xs: Sequence[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def _p50(xs: Sequence[float]) -> float | None:
    return float(np.median(xs)) if xs else None


def reusable(records: Sequence[TurnRecord]) -> dict[tuple[int, int], int]:
    """(session, turn) → reusable tokens (module doc); turn 1 of a session has none."""
    prev: dict[int, TurnRecord] = {}
    out: dict[tuple[int, int], int] = {}
    for r in sorted(records, key=lambda r: (r.session, r.turn)):
        p = prev.get(r.session)
        out[(r.session, r.turn)] = (
            min(r.prompt_tokens, p.prompt_tokens + p.completion_tokens) if p else 0
        )
        if r.ok:
            prev[r.session] = r
    return out


def per_turn(records: Sequence[TurnRecord]) -> list[dict[str, Any]]:
    """One row per turn index over the sessions' successful turns."""
    reuse = reusable(records)
    by_turn: dict[int, list[TurnRecord]] = defaultdict(list)
    for r in records:
        if r.ok:
            by_turn[r.turn].append(r)
    rows = []
    for turn in sorted(by_turn):
        rs = by_turn[turn]
        prompt = sum(r.prompt_tokens for r in rs)
        cached = sum(r.cached_tokens for r in rs)
        rows.append(
            {
                "turn": turn,
                "sessions": len(rs),
                "prompt_tokens_mean": prompt / len(rs),
                "cached_tokens_mean": cached / len(rs),
                "computed_tokens_mean": (prompt - cached) / len(rs),
                "hit_rate": cached / prompt if prompt else 0.0,
                "hit_rate_min": min(
                    (r.cached_tokens / r.prompt_tokens if r.prompt_tokens else 0.0) for r in rs
                ),
                "reusable_rate": sum(reuse[(r.session, r.turn)] for r in rs) / max(prompt, 1),
                "ttft_mean_s": _mean([r.ttft_s for r in rs if r.ttft_s is not None]),
                "tpot_mean_s": _mean([r.tpot_s for r in rs if r.tpot_s is not None]),
                "e2e_mean_s": _mean([r.e2e_s for r in rs if r.e2e_s is not None]),
                "tool_calls": sum(r.tool_calls for r in rs),
            }
        )
    return rows


def ttft_by_history(records: Sequence[TurnRecord], width: int | None = None) -> list[dict]:
    """Mean TTFT and computed tokens of the turns after the first, binned by prompt length."""
    rs = [r for r in records if r.ok and r.turn > 1 and r.ttft_s is not None]
    if not rs:
        return []
    top = max(r.prompt_tokens for r in rs)
    width = width or (1024 if top <= 16384 else 4096)
    bins: dict[int, list[TurnRecord]] = defaultdict(list)
    for r in rs:
        bins[r.prompt_tokens // width].append(r)
    return [
        {
            "prompt_tokens": [b * width, (b + 1) * width],
            "turns": len(bins[b]),
            "ttft_mean_s": _mean([r.ttft_s for r in bins[b] if r.ttft_s is not None]),
            "computed_tokens_mean": _mean([r.prompt_tokens - r.cached_tokens for r in bins[b]]),
        }
        for b in sorted(bins)
    ]


def summary(records: Sequence[TurnRecord], wall_s: float, ended: dict[int, str]) -> dict:
    """The run in a few numbers, with the target's check over the turns after the first."""
    ok = [r for r in records if r.ok]
    later = [r for r in ok if r.turn > 1]
    rates = [r.cached_tokens / r.prompt_tokens for r in later if r.prompt_tokens]
    prompt = sum(r.prompt_tokens for r in later)
    cached = sum(r.cached_tokens for r in later)
    reuse = reusable(records)
    out = sum(r.completion_tokens for r in ok)

    def stat(vals: list[float]) -> dict[str, float | None]:
        return {"mean": _mean(vals), "p50": _p50(vals)}

    return {
        "turns_ok": len(ok),
        "turns_failed": len(records) - len(ok),
        "sessions_ended": {str(s): why for s, why in sorted(ended.items())},
        "wall_s": wall_s,
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "cached_tokens": sum(r.cached_tokens for r in ok),
        "output_tokens": out,
        "output_tok_per_s": out / max(wall_s, 1e-9),
        "hit_rate_after_first": cached / prompt if prompt else None,
        "hit_rate_min_after_first": min(rates) if rates else None,
        "reusable_rate_after_first": (
            sum(reuse[(r.session, r.turn)] for r in later) / prompt if prompt else None
        ),
        "turns_meeting_target": sum(x >= HIT_TARGET for x in rates),
        "turns_after_first": len(rates),
        "target_met": bool(rates) and all(x >= HIT_TARGET for x in rates),
        "ttft_s": stat([r.ttft_s for r in ok if r.ttft_s is not None]),
        "ttft_after_first_s": stat([r.ttft_s for r in later if r.ttft_s is not None]),
        "tpot_s": stat([r.tpot_s for r in ok if r.tpot_s is not None]),
        "e2e_s": stat([r.e2e_s for r in ok if r.e2e_s is not None]),
        "tool_calls": sum(r.tool_calls for r in ok),
        "first_errors": [r.error for r in records if not r.ok][:3],
    }


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def format_run(run: dict[str, Any]) -> str:
    """A run's per-turn table and its summary lines, as text (only its probe after
    `--probe-only`)."""
    title = f"## {run['engine']} ({run.get('dtype') or 'dtype as served'})"
    probe = run.get("probe")
    if "summary" not in run:
        return "\n".join([title, format_probe(probe) if probe else "no agent turns, no probe"])
    s = run["summary"]
    lines = [
        title,
        "| turn | prompt | cached | computed | hit rate (min) | reusable | TTFT ms | TPOT ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in run["turns"]:
        lines.append(
            f"| {t['turn']} | {t['prompt_tokens_mean']:.0f} | {t['cached_tokens_mean']:.0f} | "
            f"{t['computed_tokens_mean']:.0f} | {_pct(t['hit_rate'])} ({_pct(t['hit_rate_min'])})"
            f" | {_pct(t['reusable_rate'])} | {_ms(t['ttft_mean_s'])} | {_ms(t['tpot_mean_s'])} |"
        )
    lines += [
        "",
        f"turns after the first at >= {HIT_TARGET:.0%} hit: {s['turns_meeting_target']} of "
        f"{s['turns_after_first']} (pooled {_pct(s['hit_rate_after_first'])}, min "
        f"{_pct(s['hit_rate_min_after_first'])}, reusable {_pct(s['reusable_rate_after_first'])})"
        f" -> target {'met' if s['target_met'] else 'NOT met'}",
        f"TTFT mean / p50 {_ms(s['ttft_s']['mean'])} / {_ms(s['ttft_s']['p50'])} ms; TPOT mean "
        f"{_ms(s['tpot_s']['mean'])} ms; E2E mean {_ms(s['e2e_s']['mean'])} ms; wall "
        f"{s['wall_s']:.1f} s; {s['turns_ok']} turns ok, {s['turns_failed']} failed; "
        f"{s['tool_calls']} tool calls",
    ]
    if probe:
        lines.append(format_probe(probe))
    return "\n".join(lines)


def format_probe(p: dict[str, Any]) -> str:
    a, h = p["alone"], p["after_history"]
    ratio = "-" if p["ttft_ratio"] is None else f"{p['ttft_ratio']:.2f}x"
    return (
        f"TTFT probe: {p['new_tokens']} new tokens after {p['history_tokens']} cached tokens "
        f"{_ms(h['ttft_median_s'])} ms (computed {h['computed_tokens']}) vs alone "
        f"{_ms(a['ttft_median_s'])} ms (computed {a['computed_tokens']}): {ratio}"
    )


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def _summary_rows(so: dict[str, Any], sp: dict[str, Any]) -> list[tuple[str, Any, Any, int]]:
    """(metric, ours, peer, kind) of two agent runs' summaries; kind 0: a rate, 1: seconds
    shown in ms, 2: a plain number."""
    return [
        ("hit rate after turn 1", so["hit_rate_after_first"], sp["hit_rate_after_first"], 0),
        (
            "min hit rate after turn 1",
            so["hit_rate_min_after_first"],
            sp["hit_rate_min_after_first"],
            0,
        ),
        ("TTFT mean (ms)", so["ttft_s"]["mean"], sp["ttft_s"]["mean"], 1),
        (
            "TTFT after turn 1 mean (ms)",
            so["ttft_after_first_s"]["mean"],
            sp["ttft_after_first_s"]["mean"],
            1,
        ),
        ("TPOT mean (ms)", so["tpot_s"]["mean"], sp["tpot_s"]["mean"], 1),
        ("E2E mean (ms)", so["e2e_s"]["mean"], sp["e2e_s"]["mean"], 1),
        ("wall (s)", so["wall_s"], sp["wall_s"], 2),
    ]


def _probe_rows(po: dict[str, Any], pp: dict[str, Any]) -> list[tuple[str, Any, Any, int]]:
    """The probe's two median TTFTs and their ratio, for both engines."""
    return [
        (
            "probe TTFT after history (ms)",
            po["after_history"]["ttft_median_s"],
            pp["after_history"]["ttft_median_s"],
            1,
        ),
        ("probe TTFT alone (ms)", po["alone"]["ttft_median_s"], pp["alone"]["ttft_median_s"], 1),
        ("probe TTFT ratio", po["ttft_ratio"], pp["ttft_ratio"], 2),
    ]


def _cell(v: Any, kind: int) -> str:
    if kind == 0:
        return _pct(v)
    if kind == 1:
        return _ms(v)
    return "-" if v is None else f"{v:.2f}"


def compare(runs: Sequence[dict[str, Any]], base: str = "vllm") -> str:
    """Each non-`base` engine against `base` in the same dtype: key metrics and their ratios
    (the agent loop's where both ran it, the probe's where both ran it)."""
    lines: list[str] = []
    by_dtype: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in runs:
        by_dtype[str(r.get("dtype"))][r["engine"]] = r
    lines.append("| dtype | metric | RadixKV | vLLM | RadixKV / vLLM |")
    lines.append("|---|---|---|---|---|")
    for dtype, engines in by_dtype.items():
        ours = next((v for k, v in engines.items() if k != base), None)
        peer = engines.get(base)
        if ours is None or peer is None:
            continue
        rows: list[tuple[str, Any, Any, int]] = []
        if "summary" in ours and "summary" in peer:
            rows += _summary_rows(ours["summary"], peer["summary"])
        if ours.get("probe") and peer.get("probe"):
            rows += _probe_rows(ours["probe"], peer["probe"])
        for name, a, b, kind in rows:
            lines.append(
                f"| {dtype} | {name} | {_cell(a, kind)} | {_cell(b, kind)} | {_ratio(a, b)} |"
            )
    return "\n".join(lines)

"""Rounds of `bench compare`: the rotated run order, and merging one column's rounds into one.

On a shared machine the background load drifts, so whichever configuration runs last in a fixed
order sees a different machine from the first. With `--rounds N` every column runs once per round
and round r starts at column r mod K (K columns), so no column always runs first or last; the
table then aggregates each column over all its rounds: per-request records merged, token counts
(hence hit rates and throughputs) summed, wall times summed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from radixkv.bench.serving.client import RequestResult
from radixkv.bench.serving.metrics import summarize

_RESULT_FIELDS = frozenset(f.name for f in dataclasses.fields(RequestResult))
# Per-round keys kept under the merged run's "rounds" list (the rest is shared by all rounds).
_ROUND_KEYS = ("round", "position", "base_url", "flushed_after_warmup", "cache_stats", "loadavg")


def round_orders(names: Sequence[str], rounds: int) -> list[list[str]]:
    """The column order of each round: round r is `names` rotated to start at index r mod K."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    k = len(names)
    if k == 0:
        return [[] for _ in range(rounds)]
    return [[names[(r + i) % k] for i in range(k)] for r in range(rounds)]


def _result(record: dict[str, Any]) -> RequestResult:
    return RequestResult(**{k: v for k, v in record.items() if k in _RESULT_FIELDS})


def merge_rounds(per_round: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One column's run results (one per round, each as `run_workload` returns it plus `round`
    and `position`) → one run whose summary covers every request of every round.

    Invariants of the merged summary: completed/errors/not_sent and all token counts are sums over
    rounds; wall_s is the sum of the rounds' wall times (so throughputs are totals ÷ total time);
    token_hit_rate is Σcached ÷ Σprompt over all rounds (not a mean of per-round rates);
    latency percentiles are over the pooled per-request records. Each request record gains a
    `round` key; each round's own summary stays under `rounds`.
    """
    if not per_round:
        raise ValueError("no rounds to merge")
    records: list[dict[str, Any]] = []
    for res in per_round:
        records += [{**rec, "round": res["round"]} for rec in res["requests"]]
    first = per_round[0]["summary"]
    summary = summarize(
        [_result(rec) for rec in records],
        sum(res["summary"]["wall_s"] for res in per_round),
        first["ideal_hit_rate"],
        sum(res["summary"]["not_sent"] for res in per_round),
    )
    merged = {k: v for k, v in per_round[0].items() if k not in (*_ROUND_KEYS, "requests")}
    merged["flushed_after_warmup"] = all(r.get("flushed_after_warmup") for r in per_round)
    merged["summary"] = summary
    merged["requests"] = records
    merged["rounds"] = [
        {**{k: res[k] for k in _ROUND_KEYS if k in res}, "summary": res["summary"]}
        for res in per_round
    ]
    if "server" in per_round[0]:
        startups = [r["server"].get("startup_s") for r in per_round if "server" in r]
        merged["server"] = {**per_round[0]["server"]}
        if any(s is not None for s in startups):
            merged["server"]["startup_s"] = startups
    return merged


def order_lines(order: Sequence[Sequence[str]]) -> list[str]:
    """Human-readable run order, one line per round (1-based)."""
    return [f"round {r + 1}: " + " → ".join(names) for r, names in enumerate(order)]

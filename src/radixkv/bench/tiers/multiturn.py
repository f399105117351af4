"""The multi-turn workload of `radixkv bench tiers` and its accounting, server-independent.

Shape: `clients` conversations x `rounds` rounds. In round r every client sends its whole history
(its r-1 earlier turns, each followed by that turn's answer) plus a new turn of `turn_len` tokens,
and asks for `output_len` tokens. Answers inside histories are SYNTHETIC (seeded ids of the
answer's length, as in radixkv.bench.inputs.workloads), so every configuration sees identical
prompts.

Accounting, per round: prompt tokens and cached tokens as the server reported them, and the
IDEAL cached tokens: what an infinite cache would hit when the prompts arrive in round-major
order, i.e. every token an earlier prompt carried (`workloads.ideal_hits`). For this workload the
ideal of client c in round r is exactly the length of its round r-1 prompt (the earlier answer's
ids are new to the cache, as a server caches the tokens it generated, not our synthetic ones).
Effective input throughput = all prompt tokens / wall time, per round and over the run; a mode's
speedup is its effective throughput over that of the L1-only mode of the same run.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixkv.bench.serving.client import RequestResult

# Token ids drawn for synthetic turns: clear of the special/control ids at the bottom of every
# vocabulary and inside the smallest vocabulary we serve.
ID_LO, ID_HI = 1000, 30000


@dataclass(frozen=True)
class Shape:
    """C clients x R rounds x (N new + O out) tokens."""

    clients: int = 8
    rounds: int = 16
    turn_len: int = 128
    output_len: int = 8

    def __post_init__(self) -> None:
        for name, v in asdict(self).items():
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")

    @property
    def working_set(self) -> int:
        """Tokens of every conversation after its last answer: what a cache must hold at the end."""
        return self.clients * self.rounds * (self.turn_len + self.output_len)

    def prompt_len(self, rnd: int) -> int:
        """Length of every client's prompt in 1-based round `rnd`."""
        return rnd * self.turn_len + (rnd - 1) * self.output_len


def vocab_size(model: str | None) -> int:
    """The model's vocabulary size from its config.json (a short name resolved, without loading
    weights); ID_HI when it cannot be read."""
    from radixkv.model.checkpoints.embedded import resolve_model

    try:
        cfg = json.loads((resolve_model(model) / "config.json").read_text())
    except (OSError, ValueError):
        return ID_HI
    size = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    return int(size) if size else ID_HI


def build_rounds(shape: Shape, seed: int = 0, vocab: int = ID_HI) -> list[list[list[int]]]:
    """prompts[round][client]; client c's prompt in round r+1 extends its round-r prompt by the
    round-r answer (output_len synthetic ids) and a new turn (turn_len ids)."""
    if vocab <= ID_LO + 1:
        raise ValueError(f"vocabulary of {vocab} ids is too small for synthetic turns")
    rng = random.Random(seed)
    hi = min(ID_HI, vocab)
    history: list[list[int]] = [[] for _ in range(shape.clients)]
    rounds: list[list[list[int]]] = []
    for _ in range(shape.rounds):
        this = []
        for c in range(shape.clients):
            history[c] = history[c] + [rng.randrange(ID_LO, hi) for _ in range(shape.turn_len)]
            this.append(list(history[c]))
            history[c] += [rng.randrange(ID_LO, hi) for _ in range(shape.output_len)]
        rounds.append(this)
    return rounds


def ideal_per_round(rounds: Sequence[Sequence[Sequence[int]]]) -> list[int]:
    """Ideal cached tokens of each round (infinite cache, prompts in round-major order)."""
    from radixkv.bench.inputs.workloads import ideal_hits

    flat = [p for prompts in rounds for p in prompts]
    hits = ideal_hits(flat)
    out, i = [], 0
    for prompts in rounds:
        out.append(sum(hits[i : i + len(prompts)]))
        i += len(prompts)
    return out


def round_record(
    rnd: int,
    results: Sequence[RequestResult],
    wall_s: float,
    ideal_cached: int,
    sent_prompt_tokens: int,
    hits_by_tier: dict[str, int],
) -> dict[str, Any]:
    """One round's row. Token counts are the server's (usage) for the successful requests;
    `errors` counts the rest. `ideal_hit_rate` is over the tokens we sent."""
    ok = [r for r in results if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpots = [r.tpot_s for r in ok if r.tpot_s is not None]
    return {
        "round": rnd,
        "requests": len(results),
        "errors": len(results) - len(ok),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "wall_s": wall_s,
        "effective_input_tok_per_s": prompt / max(wall_s, 1e-9),
        "token_hit_rate": cached / prompt if prompt else 0.0,
        "ideal_hit_rate": ideal_cached / sent_prompt_tokens if sent_prompt_tokens else 0.0,
        "ideal_cached_tokens": ideal_cached,
        "sent_prompt_tokens": sent_prompt_tokens,
        "ttft_mean_s": sum(ttfts) / len(ttfts) if ttfts else None,
        "tpot_mean_s": sum(tpots) / len(tpots) if tpots else None,
        "hits_by_tier": dict(hits_by_tier),
        "first_errors": [r.error for r in results if not r.ok][:3],
    }


def last_rounds(n_rounds: int, frac: float = 1 / 3) -> list[int]:
    """The 1-based rounds of the last `frac` of a run (at least one): R=16 → rounds 11..16."""
    k = max(1, math.ceil(n_rounds * frac - 1e-9))
    return list(range(n_rounds - k + 1, n_rounds + 1))


def _rates(rows: Sequence[dict[str, Any]]) -> tuple[float, float]:
    """(hit rate, ideal hit rate) pooled over rows: Σcached / Σprompt, not a mean of rates."""
    prompt = sum(r["prompt_tokens"] for r in rows)
    sent = sum(r["sent_prompt_tokens"] for r in rows)
    hit = sum(r["cached_tokens"] for r in rows) / prompt if prompt else 0.0
    return hit, (sum(r["ideal_cached_tokens"] for r in rows) / sent if sent else 0.0)


def mode_summary(rows: Sequence[dict[str, Any]], frac: float = 1 / 3) -> dict[str, Any]:
    """A mode's run in a few numbers: totals, pooled hit rates (whole run and last `frac` of the
    rounds, each with its ideal) and the effective input throughput (Σprompt / Σwall)."""
    prompt = sum(r["prompt_tokens"] for r in rows)
    wall = sum(r["wall_s"] for r in rows)
    hit, ideal = _rates(rows)
    last = last_rounds(len(rows), frac)
    last_hit, last_ideal = _rates([r for r in rows if r["round"] in last])
    return {
        "prompt_tokens": prompt,
        "cached_tokens": sum(r["cached_tokens"] for r in rows),
        "errors": sum(r["errors"] for r in rows),
        "wall_s": wall,
        "effective_input_tok_per_s": prompt / max(wall, 1e-9),
        "token_hit_rate": hit,
        "ideal_hit_rate": ideal,
        "last_rounds": [last[0], last[-1]],
        "last_hit_rate": last_hit,
        "last_ideal_hit_rate": last_ideal,
    }


def ideal_speedup(rounds: Sequence[Sequence[Sequence[int]]]) -> float:
    """All prompt tokens / the tokens an ideal cache still computes: the effective-throughput
    gain a perfect cache would give if time were proportional to computed tokens."""
    total = sum(len(p) for prompts in rounds for p in prompts)
    return total / max(total - sum(ideal_per_round(rounds)), 1)


def speedups(modes: dict[str, dict[str, Any]], base: str = "L1") -> dict[str, float]:
    """Each finished mode's effective input throughput over `base`'s (empty without `base`)."""
    ref = modes.get(base, {}).get("summary")
    if not ref:
        return {}
    tput = ref["effective_input_tok_per_s"]
    return {
        name: m["summary"]["effective_input_tok_per_s"] / tput
        for name, m in modes.items()
        if m.get("summary")
    }


def write_json(results: dict[str, Any], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(results, indent=2) + "\n")

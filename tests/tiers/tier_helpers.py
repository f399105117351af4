"""Helpers for tier tests: engines over the toy model with tiers, runs checked against the
cache-off reference after every step (census of device AND host pools)."""

from __future__ import annotations

import random
from typing import Any

from engine_helpers import GREEDY, make_engine, run_checked
from engine_toy import ToyLM

from radixkv.engine.engine import Engine

LM = ToyLM()


def prompts(seed: int = 0, n: int = 6, length: int = 90) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(38) for _ in range(length // 2)]
    return [shared + [rng.randrange(38) for _ in range(length // 2)] for _ in range(n)]


_REF: dict[tuple[int, int, int], list[list[int]]] = {}


def reference(seed: int = 0, n: int = 6, length: int = 90, lm: Any = LM) -> list[list[int]]:
    key = (seed, n, length)
    if key not in _REF or lm is not LM:
        e = make_engine(lm, disable_radix_cache=True)
        out = [o.output_token_ids for o in run_checked(e, prompts(seed, n, length), GREEDY)]
        if lm is not LM:
            return out
        _REF[key] = out
    return _REF[key]


def tier_engine(lm: Any = LM, **kw: Any) -> Engine:
    """A small device pool (a fraction of the working set), page size 4, tiers on."""
    args: dict[str, Any] = {"num_slots": 192, "page_size": 4, "enable_hierarchical_cache": True}
    args.update(kw)
    return make_engine(lm, **args)


def run(engine: Engine, seed: int = 0, n: int = 6, length: int = 90) -> list[list[int]]:
    return [o.output_token_ids for o in run_checked(engine, prompts(seed, n, length), GREEDY)]


def run_one_by_one(
    engine: Engine, seed: int = 0, n: int = 6, length: int = 90, repeat: int = 1
) -> list[list[int]]:
    """Requests one after another (each finds the previous ones' pages in the tiers); each
    prompt `repeat` times in a row (only the last run's output is returned)."""
    out = []
    for p in prompts(seed, n, length):
        for _ in range(repeat):
            got = [o.output_token_ids for o in run_checked(engine, [p], GREEDY)]
        out.extend(got)
    return out

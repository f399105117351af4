"""Helpers for tier tests: engines over the toy model with tiers, runs checked against the
cache-off reference after every step (census of device AND host pools)."""

from __future__ import annotations

import random
import time
from typing import Any

from engine_helpers import GREEDY, make_engine, run_checked
from engine_toy import ToyLM

from radixkv.engine.engine import Engine
from radixkv.storage import StorageError

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


class SlowBackend:
    """Wraps an engine's storage backend (`engine.tiers.worker.backend`): every read round trip
    takes `delay_s` more (only those that return a value, with `hits_only`), or fails (`down`)."""

    def __init__(
        self, inner: Any, delay_s: float = 0.0, down: bool = False, hits_only: bool = False
    ) -> None:
        self.inner, self.delay_s, self.down, self.hits_only = inner, delay_s, down, hits_only
        self.name = inner.name

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        if self.down:
            raise StorageError("down")
        out: list[bytes | None] = self.inner.get_many(keys)
        if not self.hits_only or (out and out[0] is not None):
            time.sleep(self.delay_s)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def pin_prefill_speed(engine: Engine, tokens_per_s: float) -> None:
    """Pin the recompute side of `engine`'s prefetch cost model to a prefill of `tokens_per_s`
    (a slow CPU's). The toy model's prefill steps take about a millisecond, as long as a file
    round trip: measured, the recompute estimate (and the hold bound it sets) follows the
    machine's load, and a test of the policy's other inputs (what was found, what is known)
    would too."""
    assert engine.tiers is not None and engine.tiers.storage is not None
    policy = engine.tiers.storage.prefetch
    for tokens in (16, 2048):
        policy.prefill.observe(float(tokens), tokens / tokens_per_s)
    policy.observe_prefill = lambda tokens, seconds: None  # type: ignore[method-assign]

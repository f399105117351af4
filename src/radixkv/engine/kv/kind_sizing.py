"""How big each kind's pool is: every kind declares its own sizing (`KindSizing`: the bytes of one
slot, the configured count, the default count, the rounding and floors of its pool), and
`split_budget` shares the KV byte budget between the kinds a model has. The registry of the
kinds' sizings is engine/kv/kinds.py (`pool_sizes`); FULL's is `FullSizing`, here.

The split, for a model with FULL slots of F bytes and token kinds (`budgeted`, e.g. SWA) of B_k
bytes, out of a budget of M bytes (--kv-cache-bytes) unless --num-slots fixes FULL:
- the even split first: every token kind as large as FULL, F_n = M // (F + sum B_k);
- a token kind with a default demand below that takes only its demand, and FULL gets what the
  demands leave: (M - sum demand_k * B_k) // F;
- a token kind takes min(FULL, its demand) (FULL when it has no demand), unless configured;
- counted kinds (STATE: whole sequences) are not in the byte budget: their default count is
  theirs alone (`demand`);
- a model without FULL layers tracks 8x its largest token kind in FULL bookkeeping slots (no
  tensor), unless --num-slots is given.
Then each kind settles its count (`settle`): whole pages, its floor, its checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from radixkv.config import EngineConfig
from radixkv.memory.hybrid import FULL, PoolSpec


@dataclass(frozen=True)
class SizeContext:
    """What a kind's pool is sized from."""

    cfg: EngineConfig
    spec: PoolSpec
    dtype: torch.dtype

    @property
    def page_size(self) -> int:
        return self.cfg.cache.page_size

    @property
    def max_running(self) -> int:
        return self.cfg.scheduler.max_running_requests

    @property
    def chunk(self) -> int:
        return self.cfg.scheduler.chunked_prefill_size

    def pages(self, tokens: int) -> int:
        """`tokens` rounded up to whole pages, in tokens."""
        return -(-tokens // self.page_size) * self.page_size


class KindSizing(Protocol):
    """How one kind's pool is sized."""

    # True: slots are tokens that share the KV byte budget with FULL (attention K/V);
    # False: slots are counted on their own (a sequence's state), outside the budget.
    budgeted: bool

    def slot_bytes(self, ctx: SizeContext) -> int:
        """Bytes of one slot of this kind's pool."""

    def explicit(self, cfg: EngineConfig) -> int | None:
        """The configured slot count (None: the default)."""

    def demand(self, ctx: SizeContext) -> int | None:
        """The default slot count (None, for a budgeted kind: as many as FULL)."""

    def settle(self, n: int, ctx: SizeContext, explicit: bool) -> int:
        """The final count from `n` (whole pages, floors); ValueError when `n` cannot serve."""


class FullSizing:
    """FULL attention: the budget's remainder, whole pages, at least one page."""

    budgeted = True

    def slot_bytes(self, ctx: SizeContext) -> int:
        return ctx.spec.slot_bytes(FULL, ctx.dtype)

    def explicit(self, cfg: EngineConfig) -> int | None:
        return cfg.cache.num_slots

    def demand(self, ctx: SizeContext) -> int | None:
        return None

    def settle(self, n: int, ctx: SizeContext, explicit: bool) -> int:
        ps = ctx.page_size
        n = n // ps * ps
        if n < ps:
            raise ValueError("the KV budget does not hold a single page")
        return n


def split_budget(ctx: SizeContext, sizings: Mapping[str, KindSizing]) -> dict[str, int]:
    """kind -> slots of its pool, for FULL (always, from `FullSizing`) and every kind of
    `sizings` (the model's other kinds, in order); the rule is the module's docstring."""
    fs = FullSizing()
    budget = ctx.cfg.cache.kv_cache_bytes
    full_b = fs.slot_bytes(ctx)
    fixed = {k: s.explicit(ctx.cfg) for k, s in sizings.items()}
    demand = {k: s.demand(ctx) for k, s in sizings.items() if fixed[k] is None}
    tokens = {k: s.slot_bytes(ctx) for k, s in sizings.items() if s.budgeted}
    full = fs.explicit(ctx.cfg)
    if full is None:
        per_token = full_b + sum(tokens.values())
        if per_token == 0:
            raise ValueError("a model without attention layers needs --num-slots")
        full = max(1, budget // per_token)  # the even split
        below = {k: d for k in tokens if (d := demand.get(k)) is not None and d < full}
        if below and full_b:
            full = (budget - sum(d * tokens[k] for k, d in below.items())) // full_b
    raw: dict[str, int] = {}
    for k, s in sizings.items():
        n = fixed[k]
        if n is None:
            d = demand[k]
            if d is None and not s.budgeted:
                raise ValueError(f"the {k} pool has no default size")
            n = full if d is None else min(full, d) if s.budgeted else d
        raw[k] = n
    if full_b == 0 and fs.explicit(ctx.cfg) is None and tokens:
        full = 8 * max(raw[k] for k in tokens)  # bookkeeping slots: how many tokens to track
    sizes = {FULL: fs.settle(full, ctx, fs.explicit(ctx.cfg) is not None)}
    for k, s in sizings.items():
        sizes[k] = s.settle(raw[k], ctx, fixed[k] is not None)
    return sizes

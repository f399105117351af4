"""The engine's running totals and the `EngineMetrics` snapshot built from them and its parts
(scheduler, KV manager, tiers, regret window), plus the periodic log line. Read on the engine's
own thread, between steps."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from radixkv.engine.request import Request
from radixkv.engine.tiers.tier_setup import Tiers
from radixkv.engine.types import EngineMetrics
from radixkv.memory.hybrid import FULL

if TYPE_CHECKING:
    from radixkv.cache.policies.research.regret import RegretWindow
    from radixkv.engine.engine import Engine

logger = logging.getLogger("radixkv.engine.engine")


@dataclass
class Totals:
    """Counters over the engine's life (requests count once, whatever their n)."""

    generated: int = 0  # output tokens, every choice
    finished: int = 0  # requests whose every choice finished
    forked: int = 0  # choices forked from a computed prompt (n > 1)
    # Cached prompt tokens of first admissions, by the tier they came from.
    tier_hits: dict[str, int] = field(
        default_factory=lambda: {"device": 0, "host": 0, "storage": 0}
    )
    last_log: float = field(default_factory=time.perf_counter)

    def count_tier_hits(self, req: Request, tiers: Tiers) -> None:
        """Split the request's cached prompt tokens by the tier they came from."""
        host, storage = tiers.loaded_split(req)
        host, storage = min(host, req.cached_tokens), min(storage, req.cached_tokens - host)
        self.tier_hits["device"] += req.cached_tokens - host - storage
        self.tier_hits["host"] += host
        self.tier_hits["storage"] += storage


def snapshot(engine: Engine) -> EngineMetrics:
    """The engine's metrics now."""
    s, kv, t = engine.scheduler, engine.kv, engine.totals
    cache = kv.cache
    return EngineMetrics(
        running_requests=len(s.running),
        waiting_requests=len(s.waiting) + len(kv.held),
        pool_slots=engine.allocator.num_slots,
        free_slots=engine.allocator.free_slots,
        cached_tokens_in_tree=cache.total_size if cache is not None else 0,
        evictable_tokens=cache.evictable_size if cache is not None else 0,
        prompt_tokens_total=s.prompt_tokens_total,
        cached_prompt_tokens_total=s.cached_prompt_tokens_total,
        generated_tokens_total=t.generated,
        num_preemptions=s.num_preemptions,
        finished_requests=t.finished,
        component_pools=component_pools(engine),
        cached_tokens_by_tier=dict(t.tier_hits),
        tier_stats=kv.tiers.stats(),
        prefill_tokens_total=s.prefill_tokens_total,
        forked_choices_total=t.forked,
        **window_fields(s.regret),
        **graph_fields(engine.runner.graphs),
    )


def graph_fields(graphs: Any) -> dict[str, Any]:
    """The decode graphs' counters (none without a graph runner)."""
    if graphs is None:
        return {}
    return {"graph_replays": graphs.replays, "graph_fallbacks": dict(graphs.fallbacks)}


def component_pools(engine: Engine) -> dict[str, dict[str, int]]:
    """Size / free / cached / held slots per pool (FULL always; SWA and STATE if any)."""
    running = engine.scheduler.running
    free, cached, held = engine.kv.census(running)
    out = {
        "full": {"size": engine.allocator.num_slots, "free": free, "cached": cached, "held": held}
    }
    if engine.pools is not None and FULL not in engine.pools:
        out["full"]["virtual"] = 1  # no FULL layer: token bookkeeping slots, no tensor
    out.update(engine.kv.comp.census(running))
    return out


def window_fields(regret: RegretWindow | None) -> dict[str, Any]:
    """The live regret window's last figures as EngineMetrics fields (none when off)."""
    if regret is None:
        return {}
    last = regret.last
    return {
        "window_requests": last.requests,
        "window_hit_rate": last.live_hit_rate,
        "window_belady_hit_rate": last.belady_hit_rate,
    }


def regret_stats(regret: RegretWindow | None, busy: bool) -> dict[str, Any]:
    """The live-regret report as plain data (`enabled` False without a window). When the last
    report covers the window as it is, that report (`fresh` True). Else, idle, the window is
    replayed whole now; busy (requests running or waiting), a whole replay would stall them
    for up to ~80 ms, so the last report is returned (`requests` = its window, `fresh` False)
    and a sliced replay of the current window starts, which the steps carry on."""
    if regret is None:
        return {"enabled": False}
    if busy and not regret.current:
        regret.refresh()
        rep, fresh = regret.last, False
    else:
        rep, fresh = regret.compute(), True
    return {"enabled": True, **dataclasses.asdict(rep), "regret": rep.regret, "fresh": fresh}


def maybe_log(engine: Engine, interval_s: float) -> None:
    """One info line of the engine's state, at most every `interval_s` seconds."""
    now = time.perf_counter()
    if now - engine.totals.last_log < interval_s:
        return
    engine.totals.last_log = now
    m = snapshot(engine)
    logger.info(
        "running=%d waiting=%d pool usage=%.1f%% token hit rate=%.1f%% cached=%d "
        "preemptions=%d finished=%d",
        m.running_requests,
        m.waiting_requests,
        100 * m.pool_usage,
        100 * m.token_hit_rate,
        m.cached_tokens_in_tree,
        m.num_preemptions,
        m.finished_requests,
    )

"""What the dashboard reads from the engine: pool census, hit counters, running/waiting requests,
and the bounded tree view. Run on the engine's own thread (between steps) through
`Engine.dashboard_state` / `Engine.cache_tree`; every result is plain data (it crosses a process
boundary unchanged) and carries no token ids or text: sizes, counts, ages and short keyed hashes.

Extension points (for tiers and hybrid pools): `memory_census` returns one entry per pool and
`hit_counters` one entry per series ("total" today; e.g. per tier or per component later). The
dashboard draws whatever entries it receives.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from radixkv.cache.tree_view import namespace_label, request_label, session_label, tree_view

if TYPE_CHECKING:
    from radixkv.engine.engine import Engine
    from radixkv.engine.request import Request

MAX_LISTED_REQUESTS = 200


def memory_census(engine: Engine) -> list[dict[str, Any]]:
    """One entry per KV pool: free + cached + held == slots (the census the tests check)."""
    free, cached, held = engine.kv.census(engine.scheduler.running)
    pools = [
        {
            "name": "kv",
            "label": f"KV pool ({engine.device})",
            "slots": engine.allocator.num_slots,
            "page_size": engine.config.page_size,
            "free": free,
            "cached": cached,
            "held": held,
        }
    ]
    tiers = getattr(engine, "tiers", None)
    if tiers is not None:  # the host (L2) pool: held = pinned by storage writes / prefetches
        ps = engine.config.page_size
        hfree, hcached, hheld = tiers.index.census()
        pools.append(
            {
                "name": "host",
                "label": "Host pool (L2)",
                "slots": tiers.index.num_pages * ps,
                "page_size": ps,
                "free": hfree * ps,
                "cached": hcached * ps,
                "held": hheld * ps,
            }
        )
    return pools


def hit_counters(engine: Engine) -> dict[str, dict[str, int]]:
    """Cumulative (cached, prompt) token counters per hit-rate series."""
    s = engine.scheduler
    out = {
        "total": {
            "cached_tokens": s.cached_prompt_tokens_total,
            "prompt_tokens": s.prompt_tokens_total,
        }
    }
    if getattr(engine, "tiers", None) is not None:  # one series per tier the hits came from
        for tier, n in engine.metrics().cached_tokens_by_tier.items():
            out[tier] = {"cached_tokens": n, "prompt_tokens": s.prompt_tokens_total}
    return out


def _request_row(req: Request, state: str, key: bytes, now: float) -> dict[str, Any]:
    return {
        "id": request_label(key, req.request_id),
        "state": state,
        "namespace": namespace_label(key, req.namespace),
        "session": session_label(key, req.options.session_id),
        "prompt_tokens": req.num_prompt,
        "cached_tokens": req.cached_tokens,
        "computed_tokens": req.kv_len,
        "output_tokens": req.num_output,
        "max_tokens": req.sampling.max_tokens,
        "preemptions": req.num_preemptions,
        "age_s": round(now - req.arrival, 3),
        "ttft_s": None
        if req.first_token_time is None
        else round(req.first_token_time - req.arrival, 4),
    }


def request_table(engine: Engine, key: bytes, limit: int) -> dict[str, Any]:
    """Running then waiting requests (at most `limit` of each), with their totals."""
    limit = max(0, min(int(limit), MAX_LISTED_REQUESTS))
    s = engine.scheduler
    now = time.perf_counter()
    return {
        "running": [_request_row(r, "running", key, now) for r in s.running[:limit]],
        "waiting": [_request_row(r, "waiting", key, now) for r in s.waiting[:limit]],
        "running_total": len(s.running),
        "waiting_total": len(s.waiting),
    }


def dashboard_state(engine: Engine, key: bytes, limit: int = 50) -> dict[str, Any]:
    """Census, hit counters, requests and the engine's headline metrics, in one snapshot."""
    m = engine.metrics()
    return {
        "metrics": {
            **dataclasses.asdict(m),
            "token_hit_rate": m.token_hit_rate,
            "pool_usage": m.pool_usage,
        },
        "pools": memory_census(engine),
        "hit_counters": hit_counters(engine),
        "requests": request_table(engine, key, limit),
        "cache": {
            "kind": engine.config.cache if engine.cache is not None else "off",
            "tokens": m.cached_tokens_in_tree,
            "evictable_tokens": m.evictable_tokens,
        },
        "generated_tokens_total": m.generated_tokens_total,
        "finished_requests": m.finished_requests,
        "preemptions": m.num_preemptions,
    }


def cache_tree(engine: Engine, top_k: int, max_depth: int, key: bytes) -> dict[str, Any]:
    """The bounded tree view, or a stub naming the cache kind when it is not a radix tree."""
    cache = engine.cache
    if cache is None:
        return {"kind": "off", "nodes": [], "namespaces": []}
    if not hasattr(cache, "iter_nodes"):
        return {
            "kind": engine.config.cache,
            "total_tokens": cache.total_size,
            "nodes": [],
            "namespaces": [],
        }
    return tree_view(cache, top_k, max_depth, key)

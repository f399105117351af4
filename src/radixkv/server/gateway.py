"""What a router in front of several `radixkv serve` replicas reads from each one.

SGLang's Model Gateway (`smg`, the `sglang-router` of old) registers a worker with `GET /health`,
`GET /v1/models`, `GET /version` and `GET /server_info` (falling back to `/get_server_info`), then
`GET /model_info` (`/get_model_info`), and polls `GET /v1/loads` for its load-aware policies and
its worker-overload veto. These routes answer in the shapes SGLang's own server uses (the field
names smg's `WorkerLoadResponse` / `ServerInfo` / `ModelInfo` parse):

    GET /server_info, /get_server_info   identity and limits (context length, pool, batch, queue)
    GET /model_info, /get_model_info     checkpoint: path, architectures, model_type
    GET /v1/loads                        {"timestamp", "version", "dp_rank_count": 1, "loads": [
                                           {"dp_rank": 0, "num_running_reqs", "num_waiting_reqs",
                                            "num_total_reqs", "num_used_tokens",
                                            "max_total_num_tokens", "token_usage", ...}]}
    GET /version                         {"version"} (vLLM's route)

`model_path` (and `tokenizer_path`) are reported only when the checkpoint directory exists on this
machine: a router that sees a `model_path` tries to load a tokenizer from it.

"Used" tokens are SGLang's: the pool minus its free slots minus the cached tokens the tree could
evict. A warm radix cache fills the pool with evictable prefixes, and counting them as used would
make every warm replica look full to the router's KV-usage threshold (smg leaves a worker out of
routing at 0.8 by default), which would send requests away from the replica holding their prefix.
"""

from __future__ import annotations

import collections
import datetime
import os
import time
from typing import Any

from fastapi import FastAPI

from radixkv import __version__

# How far back the generation rate in /v1/loads looks (its samples are the polls themselves).
THROUGHPUT_WINDOW_S = 30.0


class ThroughputMeter:
    """Generated tokens per second over the last THROUGHPUT_WINDOW_S, from the engine's running
    total sampled at each call (a router polls /v1/loads every few seconds)."""

    def __init__(self, window_s: float = THROUGHPUT_WINDOW_S) -> None:
        self.window_s = window_s
        self.samples: collections.deque[tuple[float, int]] = collections.deque()

    def rate(self, generated_total: int, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        samples = self.samples
        if samples and generated_total < samples[-1][1]:
            samples.clear()  # a new engine (restarted): its total starts again
        samples.append((now, generated_total))
        # Keep one sample at or before the window's start, so the rate spans the whole window.
        while len(samples) > 2 and samples[1][0] <= now - self.window_s:
            samples.popleft()
        t0, g0 = samples[0]
        return (generated_total - g0) / (now - t0) if now > t0 else 0.0


def local_model_path(state: Any) -> str | None:
    """The checkpoint directory, if it exists here (a router loads a tokenizer from it)."""
    path = getattr(state.engine, "model_path", None)
    return path if path and os.path.isdir(path) else None


def load_snapshot(state: Any, gen_throughput: float = 0.0) -> dict[str, Any]:
    """One rank's load in SGLang's `/v1/loads` shape, from the engine's latest metrics (pushed
    after every step: no round trip to the engine)."""
    m = state.engine.metrics()
    sched = state.config.scheduler
    pool = int(m.pool_slots)
    used = max(0, pool - int(m.free_slots) - int(m.evictable_tokens))
    running, waiting = int(m.running_requests), int(m.waiting_requests)
    return {
        "dp_rank": 0,
        "num_running_reqs": running,
        "num_waiting_reqs": waiting,
        "num_total_reqs": running + waiting,
        "num_used_tokens": used,
        "max_total_num_tokens": pool,
        "token_usage": round(used / pool, 4) if pool else 0.0,
        "num_cached_tokens": int(m.cached_tokens_in_tree),
        "cache_hit_rate": round(m.token_hit_rate, 4),
        "gen_throughput": round(gen_throughput, 2),
        "max_running_requests": int(sched.max_running_requests),
        "max_queued_requests": int(sched.max_queued_requests),
    }


def server_info(state: Any) -> dict[str, Any]:
    cfg = state.config
    path = local_model_path(state)
    out: dict[str, Any] = {
        "served_model_name": state.model_name,
        "version": __version__,
        "engine": "radixkv",
        "context_length": state.max_model_len,
        "max_total_tokens": int(state.engine.metrics().pool_slots),
        "max_running_requests": cfg.scheduler.max_running_requests,
        "max_queued_requests": cfg.scheduler.max_queued_requests,
        "page_size": cfg.cache.page_size,
        "prefix_cache": cfg.cache.kind if cfg.prefix_cache_enabled else None,
        "eviction_policy": cfg.cache.eviction_policy,
        "schedule_policy": cfg.scheduler.schedule_policy,
        "tp_size": 1,
        "dp_size": 1,
        "pp_size": 1,
        "is_embedding": False,
    }
    if path is not None:
        out["model_path"] = out["tokenizer_path"] = path
    return out


def model_info(state: Any) -> dict[str, Any]:
    path = local_model_path(state)
    out: dict[str, Any] = {
        "served_model_name": state.model_name,
        "is_generation": True,
        "has_image_understanding": False,
        "has_audio_understanding": False,
        **getattr(state.engine, "model_meta", {}),
    }
    if path is not None:
        out["model_path"] = out["tokenizer_path"] = path
    return out


def install_gateway_routes(app: FastAPI, state: Any) -> None:
    """Add the routes above (behind --api-key like every route but /health: give the router the
    same key, which it sends to its workers)."""
    meter = ThroughputMeter()

    async def _server_info() -> dict[str, Any]:
        return server_info(state)

    async def _model_info() -> dict[str, Any]:
        return model_info(state)

    for path in ("/server_info", "/get_server_info"):  # SGLang's names, new and old
        app.add_api_route(path, _server_info, methods=["GET"])
    for path in ("/model_info", "/get_model_info"):
        app.add_api_route(path, _model_info, methods=["GET"])

    @app.get("/v1/loads")
    async def loads() -> dict[str, Any]:
        rate = meter.rate(int(state.engine.metrics().generated_tokens_total))
        return {
            "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "version": __version__,
            "dp_rank_count": 1,
            "loads": [load_snapshot(state, rate)],
        }

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

"""Building the engine for `radixkv serve` / `radixkv demo` (in its own process by default) and for
the in-process commands (`generate`, `chat`).

Nothing here imports torch at module level: the engine process imports it when it builds.
"""

from __future__ import annotations

import argparse
import functools
import logging
import time
from typing import Any

from radixkv.engine.types import EngineConfig

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
log = logging.getLogger("radixkv.server")


def add_engine_mode_args(parser: argparse.ArgumentParser) -> None:
    """Flags of the commands that serve HTTP: where the engine runs and with how many threads."""
    g = parser.add_argument_group("engine process")
    g.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads for the engine (0: torch's default, one per core)",
    )
    g.add_argument(
        "--in-process",
        action="store_true",
        help="run the engine on a thread of the server process instead of its own process "
        "(for debugging and comparison)",
    )


def build_engine_from_config(config: EngineConfig) -> Any:
    """The Engine for `config`, logging what was built (runs in the engine process for serve)."""
    from radixkv.engine.engine import Engine

    model = config.model
    log.info("loading model %s", model or f"{DEFAULT_MODEL_NAME} (embedded default)")
    t0 = time.perf_counter()
    engine = Engine(model=model, config=config)
    m = engine.metrics()
    cfg = engine.config
    log.info(
        "engine ready in %.1f s: pool %d token slots, cache=%s%s, page_size=%d, eviction=%s, "
        "schedule=%s, chunked_prefill=%d, max_running=%d, device=%s, dtype=%s",
        time.perf_counter() - t0,
        m.pool_slots,
        cfg.cache,
        "" if cfg.prefix_cache_enabled else " (disabled)",
        cfg.page_size,
        cfg.eviction_policy,
        cfg.schedule_policy,
        cfg.chunked_prefill_size,
        cfg.max_running_requests,
        getattr(engine, "device", cfg.device),
        str(getattr(getattr(engine, "lm", None), "dtype", cfg.dtype)).removeprefix("torch."),
    )
    return engine


def open_server_engine(args: argparse.Namespace) -> Any:
    """What `create_app` gets for these flags: a launched ProcessEngine (default), or an Engine
    object built here with --in-process. Raises EngineStartError with a message for the user."""
    from radixkv.engine.args import engine_config_from_args
    from radixkv.server.engine_proc import EngineStartError, ProcessEngine

    config = engine_config_from_args(args)
    threads = int(getattr(args, "threads", 0) or 0)
    if getattr(args, "in_process", False):
        if threads > 0:
            import torch

            torch.set_num_threads(threads)
        try:
            return build_engine_from_config(config)
        except Exception as exc:
            raise EngineStartError(f"{type(exc).__name__}: {exc}") from exc
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
    factory = functools.partial(build_engine_from_config, config)
    return ProcessEngine(factory, threads=threads, log_level=level).launch()


def close_server_engine(engine: Any) -> None:
    """Release the engine whatever happened to the server: end a ProcessEngine's process (whose
    engine closes itself there), or close an in-process Engine (flushes pending L3 writes)."""
    if hasattr(engine, "close"):
        engine.close()

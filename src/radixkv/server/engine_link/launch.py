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

from radixkv.config import EngineConfig, ServerConfig

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
log = logging.getLogger("radixkv.server")


def add_engine_mode_args(parser: argparse.ArgumentParser) -> None:
    """The engine-process flags (--threads, --in-process) of the server section, alone: for
    commands that serve HTTP without the rest of the server flags (`radixkv demo`)."""
    ServerConfig.add_args(parser, only=("threads", "in_process"))


def build_engine_from_config(config: EngineConfig) -> Any:
    """The Engine for `config`, logging what it resolved (runs in the engine process for serve;
    the configuration printout itself is logged by the command, before it starts the engine)."""
    from radixkv.engine.engine import Engine

    model = config.model.path
    log.info("loading model %s", model or f"{DEFAULT_MODEL_NAME} (embedded default)")
    t0 = time.perf_counter()
    engine = Engine(model=model, config=config)
    log.info(
        "engine ready in %.1f s: pool %d token slots, max_model_len %d, device=%s, dtype=%s",
        time.perf_counter() - t0,
        engine.metrics().pool_slots,
        engine.max_model_len,
        engine.device,
        str(getattr(engine.lm, "dtype", config.model.dtype)).removeprefix("torch."),
    )
    return engine


def open_server_engine(config: EngineConfig) -> Any:
    """What `create_app` gets for this (validated) configuration: a launched ProcessEngine
    (default), or an Engine object built here with `server.in_process`. Raises
    EngineStartError with a message for the user."""
    from radixkv.server.engine_link.engine_proc import EngineStartError, ProcessEngine

    threads, in_process = config.server.threads, config.server.in_process
    config = config.override(api_key=None)  # the engine never needs the key: it stays here
    if in_process:
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

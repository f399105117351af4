"""A real uvicorn server on 127.0.0.1 (an OS-chosen free port) in a thread, for tests; and the
FakeEngine behind it in either engine mode (an object on a loop thread, or its own process)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from server_fakes import FakeEngine

from radixkv.server.background import BackgroundServer
from radixkv.server.engine_link.engine_proc import ProcessEngine
from radixkv.server.engine_link.launch import close_server_engine

LiveServer = BackgroundServer
MODES = ("thread", "process")


@contextmanager
def live_server(
    engine: Any, model_name: str = "test-model", api_key: str | None = None
) -> Iterator[BackgroundServer]:
    with BackgroundServer(engine, model_name, api_key=api_key) as srv:
        yield srv


@contextmanager
def fake_server(
    mode: str, model_name: str = "test-model", api_key: str | None = None, **fake: Any
) -> Iterator[BackgroundServer]:
    """A live server over FakeEngine(**fake), in-process ("thread") or in its own process."""
    engine: Any
    if mode == "thread":
        engine = FakeEngine(**fake)
    else:
        engine = ProcessEngine(functools.partial(FakeEngine, **fake)).launch()
    try:
        with live_server(engine, model_name, api_key) as srv:
            yield srv
    finally:
        close_server_engine(engine)

"""A real uvicorn server on 127.0.0.1 (an OS-chosen free port) in a thread, for tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from radixkv.server.background import BackgroundServer

LiveServer = BackgroundServer


@contextmanager
def live_server(
    engine: Any, model_name: str = "test-model", api_key: str | None = None
) -> Iterator[BackgroundServer]:
    with BackgroundServer(engine, model_name, api_key=api_key) as srv:
        yield srv

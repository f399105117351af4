"""Helpers to run a real uvicorn server on 127.0.0.1 (an OS-chosen free port) in a thread."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from radixkv.server.app import create_app


class LiveServer:
    """A uvicorn server in a background thread; `url` is its base URL, `state` the ServerState."""

    def __init__(self, engine: Any, model_name: str, api_key: str | None = None) -> None:
        self.engine = engine
        self.app = create_app(engine, model_name, api_key=api_key)
        self.state = self.app.state.radixkv
        config = uvicorn.Config(self.app, log_level="warning", lifespan="on", timeout_keep_alive=2)
        self.server = uvicorn.Server(config)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


@contextmanager
def live_server(
    engine: Any, model_name: str = "test-model", api_key: str | None = None
) -> Iterator[LiveServer]:
    srv = LiveServer(engine, model_name, api_key)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()

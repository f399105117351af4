"""Run the HTTP server in a background thread (the demo and tests use it).

The socket is bound before the thread starts (port 0 → the OS picks a free port), so there is no
race between choosing a port and serving on it.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from radixkv.server.app import ServerState, create_app


class BackgroundServer:
    """uvicorn serving `create_app(engine, ...)` on host:port in a daemon thread."""

    def __init__(
        self,
        engine: Any,
        model_name: str,
        api_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
    ) -> None:
        self.engine = engine
        self.app = create_app(engine, model_name, api_key=api_key)
        self.state: ServerState = self.app.state.radixkv
        config = uvicorn.Config(
            self.app, log_level=log_level, timeout_keep_alive=2, timeout_graceful_shutdown=5
        )
        self.server = uvicorn.Server(config)
        # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted connections only for
        # sockets that say so, and without it Nagle + delayed ACKs add ~40 ms to every response.
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://{host}:{self.port}"
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def start(self, timeout: float = 60.0) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the HTTP server did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

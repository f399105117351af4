"""AsyncEngine: the in-process engine mode — an Engine object driven by one loop thread.

Used by the tests (fake and toy engines passed as objects to `create_app`), by `radixkv demo
--in-process` and `radixkv serve --in-process`. `radixkv serve` runs the engine in its own process
instead (engine_proc.ProcessEngine); both implement EngineClient (engine_client.py) and run the same
EngineCore loop (engine_core.py).

Threading model: exactly one thread — the loop thread started here — ever touches the Engine. The
event loop talks to it only through a thread-safe command queue, and the loop thread talks back
only through `loop.call_soon_threadsafe`, once per step, with that step's Outputs. Call results
are pickled and unpickled on the way, as in process mode, so nobody holds live engine objects and
a call that could not cross a process boundary fails here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
from collections.abc import Sequence

from radixkv.server.engine_link.engine_client import EngineClient
from radixkv.server.engine_link.engine_core import (
    Command,
    EngineCore,
    EngineInfo,
    EngineLike,
    Outputs,
    StopCmd,
    by_value,
)

__all__ = ["AsyncEngine", "EngineLike"]

log = logging.getLogger("radixkv.server")


class AsyncEngine(EngineClient):
    """Owns an Engine through a loop thread; `submit` returns an asyncio.Queue of StreamDeltas."""

    def __init__(self, engine: EngineLike, max_inflight: int | None = None) -> None:
        super().__init__(max_inflight)
        self.engine = engine
        self._set_info(EngineInfo.of(engine, os.getpid()))
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # ---- lifecycle (event-loop side) ----
    def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="radixkv-engine", daemon=True)
        self._thread.start()

    async def stop(self, timeout: float = 30.0) -> None:
        thread = self._thread
        if thread is None:
            return
        self._stopping.set()
        self._commands.put(StopCmd())
        await asyncio.to_thread(thread.join, timeout)
        self._thread = None
        self._fail_all("server shutting down")

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.fatal_error is None

    def _send(self, cmd: Command) -> None:
        self._commands.put(cmd)

    # ---- loop thread ----
    def _run(self) -> None:
        core = EngineCore(self.engine)
        core.run(self._recv, self._emit, self._stopping.is_set)

    def _recv(self, timeout: float) -> Sequence[Command]:
        cmds: list[Command] = []
        try:
            first = self._commands.get(timeout=timeout) if timeout else self._commands.get_nowait()
            cmds.append(first)
            while True:
                cmds.append(self._commands.get_nowait())
        except queue.Empty:
            pass
        return cmds

    def _emit(self, out: Outputs) -> None:
        # Results cross by value, as they would between processes.
        out.results = by_value(out.results)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # loop closed since the check
                loop.call_soon_threadsafe(self._on_output, out)

"""ProcessEngine: the engine core in its own process (the mode `radixkv serve` uses).

The API process (this side) does HTTP, tokenization, the chat template and response assembly; the
engine process (engine_proc_main) schedules, runs the model, and detokenizes (see docs/server.md
for why detokenization and stop strings stay with the engine). They talk over ZeroMQ (ipc.py): a
command per add/abort/call, and one Outputs message per engine step back.

Lifecycle:
    engine = ProcessEngine(partial(build_engine_from_config, cfg), threads=2).launch()
        # spawns the process and waits for EngineInfo; raises EngineStartError with the engine's
        # own message (bad model path...) if it cannot start
    app = create_app(engine, name)   # the app's lifespan calls start() / await stop()
    engine.close()                   # synchronous cleanup if the app never ran

Failure handling: a pidfd (or, where there is none, a 0.5 s poll) tells the event loop the
moment the engine process exits; every request in flight then ends with an error, new ones get
503, and /health answers 503. The engine process exits by itself if this process dies
(engine_proc_main).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from radixkv.engine.types import RequestError
from radixkv.server.engine_link import ipc
from radixkv.server.engine_link.engine_client import EngineClient
from radixkv.server.engine_link.engine_core import Command, EngineInfo, Outputs, StopCmd
from radixkv.server.engine_link.engine_proc_main import EngineSpec

log = logging.getLogger("radixkv.server")


class EngineStartError(RuntimeError):
    """The engine process could not start; the message is meant for the user."""


class ProcessEngine(EngineClient):
    """An EngineClient whose engine runs in a child process built by `factory()` there."""

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        threads: int = 0,
        log_level: str = "info",
        max_inflight: int | None = None,
        startup_timeout: float = 1800.0,
    ) -> None:
        super().__init__(max_inflight)
        self.factory = factory
        self.threads = threads
        self.log_level = log_level
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self._ctx: zmq.Context[Any] | None = None
        self._tx: zmq.Socket[Any] | None = None
        self._rx: zmq.Socket[Any] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._poller: asyncio.Task[None] | None = None
        self._exit_fd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._stopping = False

    # ---- launch (blocking, before the event loop serves) ----
    def launch(self) -> ProcessEngine:
        if self.proc is not None:
            return self
        self._dir = Path(tempfile.mkdtemp(prefix="radixkv-"))
        cmd_addr, out_addr = ipc.addresses(self._dir)
        self._ctx = zmq.Context()
        self._tx = ipc.open_socket(self._ctx, zmq.PUSH, cmd_addr, bind=True)
        self._rx = ipc.open_socket(self._ctx, zmq.PULL, out_addr, bind=True)
        spec = EngineSpec(
            factory=self.factory,
            commands_address=cmd_addr,
            outputs_address=out_addr,
            parent_pid=os.getpid(),
            threads=self.threads,
            log_level=self.log_level,
            pdeathsig=threading.current_thread() is threading.main_thread(),
        )
        env = dict(os.environ)
        # The factory is pickled by reference: the child must import what we can import.
        paths = [p for p in (os.path.abspath(p or os.curdir) for p in sys.path) if os.path.isdir(p)]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "radixkv.server.engine_link.engine_proc_main"],
            stdin=subprocess.PIPE,
            env=env,
        )
        try:
            assert self.proc.stdin is not None
            ipc.write_frame(self.proc.stdin, spec)  # stdin then stays open: our lifeline
            # Unpickling the engine's tokenizer imports radixkv.model (and torch, seconds): do
            # it now, while the engine process is busy loading, rather than after.
            with contextlib.suppress(ImportError):
                importlib.import_module("radixkv.model.tokenizer")
            self._set_info(self._wait_ready())
            self._pid = self.proc.pid
        except BaseException:
            self.close()
            raise
        log.info("engine process %d ready", self.proc.pid)
        return self

    def _wait_ready(self) -> EngineInfo:
        assert self.proc is not None and self._rx is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            for msg in ipc.recv_ready(self._rx, 0.2):
                if isinstance(msg, EngineInfo):
                    return msg
                if isinstance(msg, ipc.StartupError):
                    raise EngineStartError(msg.message)
            code = self.proc.poll()
            if code is not None:
                raise EngineStartError(f"the engine process exited with code {code} at start-up")
        raise EngineStartError(f"the engine did not start within {self.startup_timeout:.0f} s")

    # ---- event loop ----
    def start(self) -> None:
        if self._started:
            return
        self.launch()
        assert self.proc is not None and self._rx is not None
        self._loop = loop = asyncio.get_running_loop()
        self._started = True
        self._reader = loop.create_task(self._read_loop(), name="radixkv-engine-reader")
        try:
            self._exit_fd = os.pidfd_open(self.proc.pid)
            loop.add_reader(self._exit_fd, self._on_exit)
        except (AttributeError, OSError):  # no pidfd here: poll instead
            self._exit_fd = None
            self._poller = loop.create_task(self._poll_exit())

    async def _read_loop(self) -> None:
        assert self._rx is not None
        rx = zmq.asyncio.Socket.from_socket(self._rx)
        try:
            while True:
                msg = ipc.loads(await rx.recv())
                if isinstance(msg, Outputs):
                    self._on_output(msg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a broken message must not leave requests hanging
            log.exception("reading from the engine process failed")
            self._die(f"lost the engine's output stream: {type(exc).__name__}: {exc}")

    async def _poll_exit(self) -> None:
        while self.proc is not None and self.proc.poll() is None:
            await asyncio.sleep(0.5)
        self._on_exit()

    def _on_exit(self) -> None:
        """The engine process ended: deliver what it sent last, then fail whatever is left."""
        if self._loop is not None and self._exit_fd is not None:
            self._loop.remove_reader(self._exit_fd)
        if self._rx is not None:
            for msg in ipc.recv_ready(self._rx, 0.0):
                if isinstance(msg, Outputs):
                    self._on_output(msg)
        code = None if self.proc is None else self.proc.wait()
        if self._stopping:
            return
        log.error("the engine process exited unexpectedly (exit code %s)", code)
        self._die(f"the engine process exited unexpectedly (exit code {code})")

    @property
    def alive(self) -> bool:
        return (
            self._started
            and not self._stopping
            and self.fatal_error is None
            and self.proc is not None
            and self.proc.poll() is None
        )

    def _send(self, cmd: Command) -> None:
        assert self._tx is not None
        try:
            self._tx.send(ipc.dumps(cmd), zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            raise RequestError(f"engine is not reachable: {exc}", 503) from None

    async def stop(self, timeout: float = 30.0) -> None:
        proc = self.proc
        if proc is None:
            return
        self._stopping = True
        with contextlib.suppress(RequestError, AssertionError):
            self._send(StopCmd())
        try:
            await asyncio.to_thread(proc.wait, timeout)
        except subprocess.TimeoutExpired:
            log.warning("the engine process did not stop within %.0f s; killing it", timeout)
        for task in (self._reader, self._poller):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self.close()
        self._fail_all("server shutting down")

    def close(self) -> None:
        """Synchronous teardown: end the process (SIGTERM, then SIGKILL) and free the sockets."""
        self._stopping = True
        if self._loop is not None and self._exit_fd is not None and not self._loop.is_closed():
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._exit_fd)
        if self._exit_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._exit_fd)
            self._exit_fd = None
        proc = self.proc
        if proc is not None:
            _end(proc)
        for sock in (self._tx, self._rx):
            if sock is not None:
                sock.close(linger=0)
        self._tx = self._rx = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _end(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()

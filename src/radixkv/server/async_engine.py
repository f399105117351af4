"""AsyncEngine: the single-threaded Engine driven by one background thread, for an asyncio server.

Threading model (the invariant everything else relies on): exactly one thread — the loop thread
started here — ever touches the Engine. The event loop talks to it only through a thread-safe
command queue (add / abort / call), and the loop thread talks back only through
`loop.call_soon_threadsafe`, once per step, with the step's StreamDeltas. So the event loop never
blocks on a forward pass, and the engine never sees concurrent calls.

Every request submitted here ends with exactly one finished delta on its stream (stop, length,
abort or error), which is what releases its in-flight slot; nothing is left dangling when a client
goes away, because the HTTP layer calls `abort()` in a `finally`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from radixkv.engine.types import (
    EngineConfig,
    EngineMetrics,
    RequestError,
    RequestOptions,
    SamplingParams,
    StreamDelta,
)

log = logging.getLogger("radixkv.server")

T = TypeVar("T")


class EngineLike(Protocol):
    """The part of the Engine contract (radixkv.engine.types) the server uses."""

    config: EngineConfig
    tokenizer: Any

    def add_request(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        request_id: str | None = None,
        options: RequestOptions = ...,
    ) -> str: ...

    def step(self) -> list[StreamDelta]: ...
    def has_unfinished(self) -> bool: ...
    def abort(self, request_id: str) -> Any: ...
    def flush_cache(self) -> bool: ...
    def metrics(self) -> EngineMetrics: ...
    def check_memory(self) -> Any: ...


@dataclass
class _Add:
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    options: RequestOptions
    accepted: asyncio.Future[None]


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Call:
    fn: Callable[[Any], Any]
    result: asyncio.Future[Any]


_STOP = object()


class AsyncEngine:
    """Owns an Engine through a loop thread; `submit` returns an asyncio.Queue of StreamDeltas."""

    def __init__(self, engine: EngineLike, max_inflight: int | None = None) -> None:
        self.engine = engine
        cfg = engine.config.scheduler
        # Past this many unfinished requests, refuse new ones (503) instead of queueing memory.
        self.max_inflight = max_inflight or (cfg.max_running_requests + cfg.max_queued_requests)
        self._commands: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._streams: dict[str, asyncio.Queue[StreamDelta]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.fatal_error: str | None = None  # set if the loop thread died; /health turns 503
        self.last_metrics: EngineMetrics = engine.metrics()
        self.steps = 0

    # ---- lifecycle (event-loop side) ----
    def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="radixkv-engine", daemon=True)
        self._thread.start()

    async def stop(self, timeout: float = 30.0) -> None:
        thread = self._thread
        if thread is None:
            return
        self._stopping.set()
        self._commands.put(_STOP)
        await asyncio.to_thread(thread.join, timeout)
        self._thread = None
        self._fail_all("server shutting down")

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.fatal_error is None

    @property
    def inflight(self) -> int:
        return len(self._streams)

    # ---- requests (event-loop side; none of these block) ----
    async def submit(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        options: RequestOptions,
    ) -> asyncio.Queue[StreamDelta]:
        """Hand a request to the engine; raises RequestError (4xx/503) if it is refused."""
        if not self.alive:
            raise RequestError(f"engine is not running: {self.fatal_error or 'stopped'}", 503)
        if len(self._streams) >= self.max_inflight:
            raise RequestError(
                f"server overloaded: {len(self._streams)} requests in flight "
                f"(limit {self.max_inflight}); retry later",
                503,
            )
        stream: asyncio.Queue[StreamDelta] = asyncio.Queue()
        self._streams[request_id] = stream
        accepted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._commands.put(_Add(request_id, prompt_ids, sampling, options, accepted))
        try:
            await accepted
        except RequestError:
            self._streams.pop(request_id, None)
            raise
        except BaseException:  # our waiter was cancelled: the add may still land, so abort it
            self._commands.put(_Abort(request_id))
            raise
        return stream

    def abort(self, request_id: str) -> None:
        """Abort a request if it is still running (idempotent; safe from a `finally`)."""
        if request_id in self._streams:
            self._commands.put(_Abort(request_id))

    async def call(self, fn: Callable[[Any], T]) -> T:
        """Run fn(engine) on the loop thread between steps and return its result."""
        if not self.alive:
            raise RequestError("engine is not running", 503)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._commands.put(_Call(fn, fut))
        return await fut

    # ---- loop thread ----
    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                busy = self.engine.has_unfinished()
                if not self._drain(block=not busy):
                    return
                if self.engine.has_unfinished():
                    t0 = time.perf_counter()
                    deltas = self.engine.step()
                    self.steps += 1
                    self.last_metrics = self.engine.metrics()
                    if deltas:
                        self._post(self._dispatch, deltas)
                    elif time.perf_counter() - t0 < 1e-3:
                        # Work queued but nothing could run (an empty step): yield the CPU and
                        # the GIL briefly instead of spinning against the event loop.
                        time.sleep(1e-3)
        except Exception as exc:  # the engine is broken; fail everyone, keep the server up
            log.exception("engine loop crashed")
            self.fatal_error = f"{type(exc).__name__}: {exc}"
            self._post(self._fail_all, f"engine failure: {self.fatal_error}")

    def _drain(self, block: bool) -> bool:
        """Apply queued commands; when idle, wait for one. Returns False on stop."""
        try:
            cmd = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            if cmd is _STOP:
                return False
            self._apply(cmd)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _apply(self, cmd: Any) -> None:
        if isinstance(cmd, _Add):
            try:
                self.engine.add_request(cmd.prompt_ids, cmd.sampling, cmd.request_id, cmd.options)
            except RequestError as exc:
                self._post(_settle, cmd.accepted, exc)
            except Exception as exc:  # an engine bug on one input must not stop the loop
                log.exception("add_request failed")
                err = RequestError(f"could not add the request: {type(exc).__name__}: {exc}", 500)
                self._post(_settle, cmd.accepted, err)
            else:
                self._post(_settle, cmd.accepted, None)
        elif isinstance(cmd, _Abort):
            try:
                delta = self.engine.abort(cmd.request_id)
            except (KeyError, RequestError):  # unknown or already finished: nothing held
                delta = None
            # Close the stream now whether or not the engine reports the abort as a delta (now
            # or next step): posted after every earlier step's deltas, so ordering is preserved.
            if not isinstance(delta, StreamDelta):
                delta = StreamDelta(cmd.request_id, [], "", finished=True, finish_reason="abort")
            self._post(self._dispatch, [delta])
        elif isinstance(cmd, _Call):
            try:
                result = cmd.fn(self.engine)
            except Exception as exc:
                self._post(_settle, cmd.result, exc)
            else:
                self.last_metrics = self.engine.metrics()
                self._post(_settle_value, cmd.result, result)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # loop closed since the check
                loop.call_soon_threadsafe(fn, *args)

    # ---- event-loop side callbacks ----
    def _dispatch(self, deltas: list[StreamDelta]) -> None:
        for delta in deltas:
            stream = self._streams.get(delta.request_id)
            if stream is None:
                continue
            if delta.finished:
                del self._streams[delta.request_id]
            stream.put_nowait(delta)

    def _fail_all(self, message: str) -> None:
        """Finish every stream with an error and refuse queued commands (loop thread gone)."""
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                break
            if isinstance(cmd, _Add):
                _settle(cmd.accepted, RequestError(message, 503))
            elif isinstance(cmd, _Call):
                _settle(cmd.result, RequestError(message, 503))
        for rid, stream in list(self._streams.items()):
            stream.put_nowait(
                StreamDelta(rid, [], "", finished=True, finish_reason="error", error=message)
            )
        self._streams.clear()


def _settle(fut: asyncio.Future[Any], exc: BaseException | None) -> None:
    if not fut.done():
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)


def _settle_value(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)

"""EngineClient: the server's handle on an engine, whichever mode runs it.

Two implementations share everything here and differ only in transport:
- `AsyncEngine` (async_engine.py): the Engine object on a loop thread of the server's process
  (tests, fake engines, `radixkv serve --in-process`);
- `ProcessEngine` (engine_proc.py): the Engine in its own process behind ZeroMQ (`radixkv serve`).

The interface (all on the event loop; none of the non-async methods blocks):
    launch()      make the engine ready (process mode: spawn it and wait for the model) → self
    start()       attach to the running event loop (the app's lifespan calls it)
    await stop()  stop the engine; every open stream ends with an error
    alive         False once the engine died or stopped (/health answers 503)
    await submit(request_id, prompt_ids, sampling, options) → asyncio.Queue[StreamDelta]
    abort(request_id)           idempotent, safe from `finally`
    await call(fn)              fn(engine) run between steps; fn must be picklable
                                (operator.methodcaller("name", *args) or a module-level function),
                                and so must its result
    metrics()     the latest EngineMetrics snapshot the engine pushed (no round trip)
    supports(name)              whether the engine has a public method `name`

Invariant: every stream handed out by `submit` gets exactly one finished delta (stop, length,
abort or error), which removes it from `_streams`; pending acks and calls are settled exactly once,
with an error if the engine dies.
"""

from __future__ import annotations

import abc
import asyncio
import itertools
import pickle
from collections.abc import Callable
from typing import Any, TypeVar

from radixkv.engine.types import (
    EngineConfig,
    EngineMetrics,
    RequestError,
    RequestOptions,
    SamplingParams,
    StreamDelta,
)
from radixkv.server.engine_link.engine_core import (
    AbortCmd,
    AddCmd,
    CallCmd,
    Command,
    EngineInfo,
    Outputs,
)

T = TypeVar("T")


class EngineClient(abc.ABC):
    """Stream bookkeeping shared by both engine modes; subclasses provide the transport."""

    config: EngineConfig
    tokenizer: Any
    max_model_len: int | None
    max_inflight: int
    last_metrics: EngineMetrics
    model_path: str | None  # the checkpoint directory the engine loaded (None: unknown)
    model_meta: dict[str, Any]  # `architectures` / `model_type` from its config.json
    kernel_paths: dict[str, str]  # the CPU and kernel paths the engine took (empty: unknown)

    def __init__(self, max_inflight: int | None = None) -> None:
        self._max_inflight_arg = max_inflight
        self.fatal_error: str | None = None  # set when the engine died; /health turns 503
        self.steps = 0  # engine steps so far (from the latest Outputs)
        self.step_seconds = 0.0  # time spent in engine.step() so far
        self._streams: dict[str, asyncio.Queue[StreamDelta]] = {}
        self._accepts: dict[str, asyncio.Future[None]] = {}
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count()
        self._methods: frozenset[str] = frozenset()
        self._pid: int | None = None

    def _set_info(self, info: EngineInfo) -> None:
        self.config = info.config
        self.tokenizer = info.tokenizer
        self.max_model_len = info.max_model_len
        self.last_metrics = info.metrics
        self._methods = info.methods
        self._pid = info.pid
        self.model_path = info.model_path
        self.model_meta = dict(info.model_meta)
        self.kernel_paths = dict(info.kernel_paths)
        cfg = info.config.scheduler
        # Past this many unfinished requests, refuse new ones (503) instead of queueing memory.
        self.max_inflight = self._max_inflight_arg or (
            cfg.max_running_requests + cfg.max_queued_requests
        )

    # ---- lifecycle (subclasses) ----
    def launch(self) -> EngineClient:
        """Make the engine ready (blocking; idempotent). Returns self."""
        return self

    @abc.abstractmethod
    def start(self) -> None:
        """Attach to the running event loop; call from inside it."""

    @abc.abstractmethod
    async def stop(self, timeout: float = 30.0) -> None:
        """Stop the engine; streams still open end with an error."""

    @property
    @abc.abstractmethod
    def alive(self) -> bool: ...

    @abc.abstractmethod
    def _send(self, cmd: Command) -> None:
        """Deliver one command to the engine (never blocks)."""

    # ---- queries ----
    @property
    def pid(self) -> int | None:
        """The engine's process id (this process's own in the in-process mode)."""
        return self._pid

    @property
    def inflight(self) -> int:
        return len(self._streams)

    def metrics(self) -> EngineMetrics:
        return self.last_metrics

    def supports(self, method: str) -> bool:
        return method in self._methods

    # ---- requests (event-loop side) ----
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
        if request_id in self._streams:
            raise RequestError(f"request id {request_id!r} is already in use", 400)
        stream: asyncio.Queue[StreamDelta] = asyncio.Queue()
        accepted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._streams[request_id] = stream
        self._accepts[request_id] = accepted
        try:
            self._send(AddCmd(request_id, prompt_ids, sampling, options))
            await accepted
        except RequestError:
            self._streams.pop(request_id, None)
            self._accepts.pop(request_id, None)
            raise
        except BaseException:  # our waiter was cancelled: the add may still land, so abort it
            self._accepts.pop(request_id, None)
            self.abort(request_id)
            raise
        return stream

    def abort(self, request_id: str) -> None:
        """Abort a request if it is still running (idempotent; safe from a `finally`)."""
        if request_id in self._streams and self.alive:
            self._send(AbortCmd(request_id))

    async def call(self, fn: Callable[[Any], T]) -> T:
        """Run fn(engine) between steps and return its (picklable) result."""
        if not self.alive:
            raise RequestError(f"engine is not running: {self.fatal_error or 'stopped'}", 503)
        check_picklable(fn)
        call_id = next(self._call_ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = fut
        try:
            self._send(CallCmd(call_id, fn))
            return await fut
        finally:
            self._calls.pop(call_id, None)

    # ---- engine output (event loop) ----
    def _on_output(self, out: Outputs) -> None:
        """Apply one engine message: acks, call results, then deltas (the order they happened)."""
        if out.metrics is not None:
            self.last_metrics = out.metrics
        self.steps, self.step_seconds = out.steps, out.step_seconds
        for request_id, err in out.accepted:
            fut = self._accepts.pop(request_id, None)
            if fut is not None:
                _settle(fut, err, None)
        for call_id, ok, value in out.results:
            call = self._calls.pop(call_id, None)
            if call is not None:
                _settle(call, None if ok else value, value if ok else None)
        streams = self._streams
        for delta in out.deltas:
            stream = streams.get(delta.request_id)
            if stream is None:  # already closed (an abort's late delta, a refused add)
                continue
            if delta.finished:
                del streams[delta.request_id]
            stream.put_nowait(delta)
        if out.fatal is not None:
            self._die(f"engine failure: {out.fatal}")

    def _die(self, message: str) -> None:
        """The engine is gone: remember why, and fail everything still waiting on it."""
        if self.fatal_error is None:
            self.fatal_error = message
        self._fail_all(message)

    def _fail_all(self, message: str) -> None:
        """Settle pending acks and calls with a 503, and end every open stream with an error."""
        for fut in [*self._accepts.values(), *self._calls.values()]:
            _settle(fut, RequestError(message, 503), None)
        self._accepts.clear()
        self._calls.clear()
        for rid, stream in list(self._streams.items()):
            stream.put_nowait(
                StreamDelta(rid, [], "", finished=True, finish_reason="error", error=message)
            )
        self._streams.clear()


def check_picklable(fn: Callable[[Any], Any]) -> None:
    """Engine calls cross a process boundary: refuse lambdas and closures in both modes."""
    try:
        pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise TypeError(
            f"engine calls must be picklable (use operator.methodcaller('name', *args) or a "
            f"module-level function), got {fn!r}: {exc}"
        ) from None


def _settle(fut: asyncio.Future[Any], exc: BaseException | None, value: Any) -> None:
    if fut.done():
        return
    if exc is None:
        fut.set_result(value)
    else:
        fut.set_exception(exc)

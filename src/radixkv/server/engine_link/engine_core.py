"""The engine side of the server: commands in, one batch of outputs per step out.

`EngineCore.run` is the loop that owns an Engine in both engine modes: on the server's loop thread
(in-process mode, `AsyncEngine`) and as the main loop of the engine process (process mode,
`engine_proc_main`). Only the transport differs: `recv(timeout)` returns the commands that have
arrived, `emit(outputs)` hands one `Outputs` back to the API side.

Invariants:
- exactly one thread ever touches the Engine (the one running `run`);
- commands are applied in arrival order, between steps, and everything they and the following step
  produce leaves in ONE `Outputs` message, in the order it happened (acks and call results first,
  then deltas), so the API side sees one message per step, not one per token;
- every `Outputs` carries a fresh EngineMetrics snapshot, and every step that did work sends one
  (even a prefill chunk that produced no token), so /metrics never needs an RPC;
- every message is plain data (the commands and outputs below, the engine/types dataclasses, and
  whatever picklable callable a `CallCmd` carries), so it can cross a process boundary unchanged.
"""

from __future__ import annotations

import json
import logging
import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from radixkv.engine.types import (
    EngineConfig,
    EngineMetrics,
    RequestError,
    RequestOptions,
    SamplingParams,
    StreamDelta,
)

log = logging.getLogger("radixkv.server")

IDLE_WAIT_S = 0.5  # an idle loop wakes this often to notice a stop request
# An idle engine woken by a new request keeps taking the requests that follow it within
# BURST_GAP_S of each other (for at most BURST_MAX_S) before its first step: clients send bursts
# (a batch job, a benchmark's N concurrent streams), and requests that miss the first step would
# otherwise wait through its whole prefill and then stall the first ones with their own. Costs a
# lone request on an idle engine BURST_GAP_S of latency; never delays a busy engine.
BURST_GAP_S = 0.003
BURST_MAX_S = 0.02


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


# ---- commands (API side → engine) ----
@dataclass(frozen=True)
class AddCmd:
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    options: RequestOptions


@dataclass(frozen=True)
class AbortCmd:
    request_id: str


@dataclass(frozen=True)
class CallCmd:
    call_id: int
    fn: Callable[[Any], Any]  # picklable: a module-level function or operator.methodcaller


@dataclass(frozen=True)
class StopCmd:
    pass


Command = AddCmd | AbortCmd | CallCmd | StopCmd


# ---- outputs (engine → API side) ----
@dataclass
class Outputs:
    """What the engine did since its last message; the client applies the fields in this order."""

    accepted: list[tuple[str, RequestError | None]] = field(default_factory=list)
    results: list[tuple[int, bool, Any]] = field(default_factory=list)  # (call_id, ok, value|exc)
    deltas: list[StreamDelta] = field(default_factory=list)
    metrics: EngineMetrics | None = None
    steps: int = 0  # engine steps run so far
    step_seconds: float = 0.0  # time spent in engine.step() so far
    fatal: str | None = None  # the engine loop died with this error; nothing more will come

    def __bool__(self) -> bool:
        return bool(self.accepted or self.results or self.deltas or self.fatal)


@dataclass(frozen=True)
class EngineInfo:
    """What the API side learns about a built engine (process mode: the ready message)."""

    config: EngineConfig
    tokenizer: Any
    max_model_len: int | None
    methods: frozenset[str]  # public methods, for `EngineClient.supports`
    metrics: EngineMetrics
    pid: int
    # The checkpoint the engine loaded: its resolved directory (None for a model object without
    # one, e.g. a test fake) and the `architectures` / `model_type` of its config.json.
    model_path: str | None = None
    model_meta: dict[str, Any] = field(default_factory=dict)
    # The CPU model and the kernel path each dtype took in the engine's process (`kernel_paths()`
    # of radixkv.model.kernels; empty for an engine without a model on the CPU).
    kernel_paths: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def of(engine: Any, pid: int) -> EngineInfo:
        kind = type(engine)
        methods = frozenset(
            n for n in dir(kind) if not n.startswith("_") and callable(getattr(kind, n, None))
        )
        limit = getattr(engine, "max_model_len", None) or engine.config.scheduler.max_model_len
        path = getattr(getattr(engine, "lm", None), "path", None)
        return EngineInfo(
            config=engine.config,
            tokenizer=engine.tokenizer,
            max_model_len=limit,
            methods=methods,
            metrics=engine.metrics(),
            pid=pid,
            model_path=str(path) if path is not None else None,
            model_meta=_checkpoint_meta(path),
            kernel_paths=_kernel_paths(engine),
        )


def _kernel_paths(engine: Any) -> dict[str, str]:
    """The kernel paths of the engine's process (its kernels are built and chosen by then, so
    this costs nothing); empty for an engine that does not report them (a test fake)."""
    report = getattr(engine, "kernel_paths", None)
    return dict(report()) if callable(report) else {}


def _checkpoint_meta(path: Any) -> dict[str, Any]:
    """`architectures` and `model_type` from the checkpoint's config.json (empty if unreadable)."""
    if path is None:
        return {}
    try:
        raw = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    out: dict[str, Any] = {}
    if isinstance(raw.get("architectures"), list):
        out["architectures"] = [str(a) for a in raw["architectures"]]
    if isinstance(raw.get("model_type"), str):
        out["model_type"] = raw["model_type"]
    return out


def by_value(results: list[tuple[int, bool, Any]]) -> list[tuple[int, bool, Any]]:
    """Call results after a pickle round trip; one that cannot be pickled becomes a TypeError."""
    out: list[tuple[int, bool, Any]] = []
    for call_id, ok, value in results:
        try:
            out.append((call_id, ok, pickle.loads(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))))
        except Exception as exc:
            what = "result" if ok else "exception"
            err = TypeError(f"the engine call's {what} cannot be pickled: {value!r}: {exc}")
            out.append((call_id, False, err))
    return out


def _burst(recv: Callable[[float], Sequence[Command]]) -> list[Command]:
    """The commands arriving right behind the one that woke an idle engine (see BURST_GAP_S)."""
    out: list[Command] = []
    deadline = time.monotonic() + BURST_MAX_S
    while time.monotonic() < deadline:
        more = recv(BURST_GAP_S)
        if not more:
            break
        out.extend(more)
        if any(isinstance(c, StopCmd) for c in more):
            break
    return out


def abort_delta(request_id: str) -> StreamDelta:
    return StreamDelta(request_id, [], "", finished=True, finish_reason="abort")


class EngineCore:
    """Applies commands and steps the engine; see the module docstring for the invariants."""

    def __init__(self, engine: EngineLike) -> None:
        self.engine = engine
        self.steps = 0
        self.step_seconds = 0.0
        self._out = Outputs()
        self._stepped = False  # a step ran since the last message (its metrics are news)

    def run(
        self,
        recv: Callable[[float], Sequence[Command]],
        emit: Callable[[Outputs], None],
        stopping: Callable[[], bool] = lambda: False,
    ) -> str | None:
        """Serve until a StopCmd or `stopping()`; returns None, or the fatal error it died of
        (after emitting it, so the API side can fail every request in flight)."""
        try:
            while not stopping():
                busy = self.engine.has_unfinished()
                cmds = list(recv(0.0 if busy else IDLE_WAIT_S))
                if not busy and any(isinstance(c, AddCmd) for c in cmds):
                    cmds += _burst(recv)
                for cmd in cmds:
                    if isinstance(cmd, StopCmd):
                        self._flush(emit)
                        return None
                    self._apply(cmd)
                if self.engine.has_unfinished():
                    self._step()
                self._flush(emit)
        except Exception as exc:  # the engine is broken: tell everyone, then stop
            log.exception("engine loop crashed")
            fatal = f"{type(exc).__name__}: {exc}"
            out, self._out = self._out, Outputs()
            out.fatal = fatal
            emit(out)
            return fatal
        return None

    def _step(self) -> None:
        t0 = time.perf_counter()
        deltas = self.engine.step()
        dt = time.perf_counter() - t0
        self.steps += 1
        self.step_seconds += dt
        self._out.deltas.extend(deltas)
        if not deltas and dt < 1e-3:
            # Work queued but nothing could run (an empty step): yield the CPU briefly instead
            # of spinning (and send nothing: nothing changed).
            time.sleep(1e-3)
        else:
            self._stepped = True  # e.g. a prefill chunk: no tokens, but the metrics moved

    def _flush(self, emit: Callable[[Outputs], None]) -> None:
        out = self._out
        if not out and not self._stepped:
            return
        self._out = Outputs()
        self._stepped = False
        out.metrics = self.engine.metrics()
        out.steps = self.steps
        out.step_seconds = self.step_seconds
        emit(out)

    def _apply(self, cmd: Command) -> None:
        out = self._out
        if isinstance(cmd, AddCmd):
            err: RequestError | None = None
            try:
                self.engine.add_request(cmd.prompt_ids, cmd.sampling, cmd.request_id, cmd.options)
            except RequestError as exc:
                err = exc
            except Exception as exc:  # an engine bug on one input must not stop the loop
                log.exception("add_request failed")
                err = RequestError(f"could not add the request: {type(exc).__name__}: {exc}", 500)
            out.accepted.append((cmd.request_id, err))
        elif isinstance(cmd, AbortCmd):
            try:
                delta = self.engine.abort(cmd.request_id)
            except (KeyError, RequestError):  # unknown or already finished: nothing held
                delta = None
            # Close the stream now whether or not the engine reports the abort as a delta (now or
            # next step); the API side ignores deltas of streams it has already closed.
            if not isinstance(delta, StreamDelta):
                delta = abort_delta(cmd.request_id)
            out.deltas.append(delta)
        elif isinstance(cmd, CallCmd):
            try:
                out.results.append((cmd.call_id, True, cmd.fn(self.engine)))
            except Exception as exc:
                out.results.append((cmd.call_id, False, exc))

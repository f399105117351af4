"""The engine-process layer without HTTP: ProcessEngine ⇄ ZeroMQ ⇄ engine process (a FakeEngine).

Round trip, typed errors and calls across the boundary, abort, an engine that crashes or is killed
(requests end with an error instead of hanging), a start-up error, and an engine process that
exits when its API process is killed -9.
"""

from __future__ import annotations

import asyncio
import functools
import operator
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from server_fakes import FakeEngine, broken_factory

from radixkv.engine.types import (
    EngineMetrics,
    RequestError,
    RequestOptions,
    SamplingParams,
    StreamDelta,
)
from radixkv.server.engine_link.async_engine import AsyncEngine
from radixkv.server.engine_link.engine_client import EngineClient
from radixkv.server.engine_link.engine_proc import EngineStartError, ProcessEngine

T = TypeVar("T")
NO_OPTIONS = RequestOptions()


def _run(make: Callable[[], EngineClient], scenario: Callable[[EngineClient], Awaitable[T]]) -> T:
    """Start the client on a fresh event loop, run the scenario, always stop it."""

    async def main() -> T:
        client = make().launch()
        client.start()
        try:
            return await asyncio.wait_for(scenario(client), 60)
        finally:
            await client.stop()

    return asyncio.run(main())


def _proc(**fake: Any) -> Callable[[], EngineClient]:
    return lambda: ProcessEngine(functools.partial(FakeEngine, **fake))


async def _drain(stream: asyncio.Queue[StreamDelta]) -> list[StreamDelta]:
    got = [await stream.get()]
    while not got[-1].finished:
        got.append(await stream.get())
    return got


def test_round_trip_matches_in_process() -> None:
    async def scenario(client: EngineClient) -> tuple[str, EngineMetrics, int]:
        sp = SamplingParams(max_tokens=12)
        deltas = await _drain(await client.submit("r1", [10, 11, 12], sp, NO_OPTIONS))
        assert [d.finished for d in deltas] == [False] * 11 + [True]
        assert deltas[-1].finish_reason == "length" and deltas[-1].completion_tokens == 12
        m = await client.call(operator.methodcaller("metrics"))
        assert client.metrics() == m  # the pushed snapshot is as fresh as a call
        return "".join(d.new_text for d in deltas), m, client.inflight

    text_p, m_p, inflight = _run(_proc(), scenario)
    text_t, m_t, _ = _run(lambda: AsyncEngine(FakeEngine()), scenario)
    assert text_p == text_t and len(text_p) == 12 and inflight == 0
    assert m_p == m_t and m_p.generated_tokens_total == 12


def test_errors_and_calls_cross_the_boundary() -> None:
    async def scenario(client: EngineClient) -> None:
        with pytest.raises(RequestError) as exc:  # prompt + max_tokens > max_model_len (512)
            await client.submit("big", [5] * 600, SamplingParams(max_tokens=1), NO_OPTIONS)
        assert exc.value.code == 400 and exc.value.param == "max_tokens"
        assert client.inflight == 0
        with pytest.raises(TypeError, match="picklable"):
            await client.call(lambda e: e.metrics())
        with pytest.raises(AttributeError):
            await client.call(operator.methodcaller("no_such_method"))
        assert await client.call(operator.methodcaller("flush_cache")) is True
        assert client.supports("flush_cache") and not client.supports("close_session")
        assert client.alive

    _run(_proc(), scenario)


def test_abort_frees_and_closes_the_stream_once() -> None:
    async def scenario(client: EngineClient) -> list[StreamDelta]:
        stream = await client.submit("r", [7, 8, 9], SamplingParams(max_tokens=400), NO_OPTIONS)
        got = [await stream.get()]
        client.abort("r")
        client.abort("r")  # idempotent
        while not got[-1].finished:
            got.append(await stream.get())
        await client.call(operator.methodcaller("check_memory"))
        m = await client.call(operator.methodcaller("metrics"))
        assert m.running_requests == 0 and client.inflight == 0
        return got

    deltas = _run(_proc(step_delay=0.002), scenario)
    assert deltas[-1].finish_reason == "abort" and sum(d.finished for d in deltas) == 1
    assert len(deltas) < 400


def test_engine_crash_fails_in_flight_requests() -> None:
    async def scenario(client: EngineClient) -> None:
        deltas = await _drain(
            await client.submit("r", [3], SamplingParams(max_tokens=100), NO_OPTIONS)
        )
        assert deltas[-1].finish_reason == "error"
        assert "injected failure" in (deltas[-1].error or "")
        assert not client.alive and "injected failure" in (client.fatal_error or "")
        with pytest.raises(RequestError) as exc:
            await client.submit("r2", [3], SamplingParams(max_tokens=1), NO_OPTIONS)
        assert exc.value.code == 503

    _run(_proc(step_delay=0.001, fail_at_step=3), scenario)


def test_killed_engine_fails_in_flight_requests() -> None:
    async def scenario(client: EngineClient) -> None:
        assert isinstance(client, ProcessEngine) and client.pid is not None
        stream = await client.submit("r", [3], SamplingParams(max_tokens=500), NO_OPTIONS)
        await stream.get()
        os.kill(client.pid, signal.SIGKILL)
        deltas = await _drain(stream)  # ends (with an error), does not hang
        assert deltas[-1].finish_reason == "error"
        assert "exited unexpectedly" in (deltas[-1].error or "")
        assert not client.alive
        with pytest.raises(RequestError) as exc:
            await client.call(operator.methodcaller("metrics"))
        assert exc.value.code == 503

    _run(_proc(step_delay=0.01), scenario)


def test_startup_error_is_a_clear_message() -> None:
    engine = ProcessEngine(broken_factory)
    with pytest.raises(EngineStartError, match=r"FileNotFoundError: no model at /nowhere"):
        engine.launch()
    assert engine.proc is not None and engine.proc.poll() is not None  # nothing left running


PARENT = textwrap.dedent(
    """
    import functools, sys, time
    from server_fakes import FakeEngine
    from radixkv.server.engine_link.engine_proc import ProcessEngine
    engine = ProcessEngine(functools.partial(FakeEngine)).launch()
    print(engine.pid, flush=True)
    time.sleep(600)
    """
)


def test_engine_exits_when_its_api_process_is_killed(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _running(child)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 30  # a liveness bound, not a performance check
        while _running(child):
            assert time.monotonic() < deadline, "the engine process outlived its API process"
            time.sleep(0.1)
    finally:
        parent.kill()


def test_engine_ends_under_a_burst_of_sigterms() -> None:
    """SIGTERM may come more than once (PR_SET_PDEATHSIG plus a supervisor, say); the handler
    runs between any two bytecodes of the main thread, also inside its own earlier run. A handler
    that takes a lock (threading.Event.set did) deadlocks there, before the hard-exit alarm."""
    engine = ProcessEngine(functools.partial(FakeEngine)).launch()
    try:
        pid = engine.pid
        assert pid is not None and _running(pid)
        deadline = time.monotonic() + 40  # HARD_EXIT_S is 30: a liveness bound
        for _ in range(20_000):  # back to back: each lands wherever the last handler is
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                break
        while _running(pid):
            assert time.monotonic() < deadline, "the engine process hung on repeated SIGTERMs"
            time.sleep(0.05)
    finally:
        engine.close()


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan is reaped by init, which may take a moment)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


class _SlowPrefill(FakeEngine):
    """Steps that produce no token (like prefill chunks) before the first one."""

    def __init__(self) -> None:
        super().__init__()
        self.silent_steps = 2

    def step(self) -> list[StreamDelta]:
        if self.silent_steps:
            self.silent_steps -= 1
            time.sleep(0.002)
            return []
        return super().step()


def test_core_one_message_per_step_in_order() -> None:
    """EngineCore without a transport: what each message holds, and in which order."""
    from radixkv.server.engine_link.engine_core import (
        BURST_GAP_S,
        AbortCmd,
        AddCmd,
        CallCmd,
        EngineCore,
        Outputs,
        StopCmd,
    )

    script: list[list[Any]] = [
        [
            AddCmd("a", [5, 6], SamplingParams(max_tokens=2), NO_OPTIONS),
            AddCmd("b", [5] * 600, SamplingParams(max_tokens=1), NO_OPTIONS),  # refused
            CallCmd(7, operator.methodcaller("metrics")),
            AbortCmd("nobody"),
        ],
        [],
        [],
        [],
        [StopCmd()],
    ]
    sent: list[Outputs] = []
    core = EngineCore(_SlowPrefill())

    def recv(timeout: float) -> list[Any]:
        if timeout == BURST_GAP_S:  # the idle engine looks for a burst: nothing more came
            return []
        return script.pop(0) if script else [StopCmd()]

    assert core.run(recv, sent.append) is None
    first = sent[0]
    assert [rid for rid, _ in first.accepted] == ["a", "b"]
    assert first.accepted[0][1] is None and first.accepted[1][1] is not None
    assert first.results[0][0] == 7 and first.results[0][1] is True
    assert [d.request_id for d in first.deltas] == ["nobody"]  # the abort closes at once
    assert first.metrics is not None and first.metrics.running_requests == 1
    # The silent step still reports (fresh metrics, no deltas); then one token per message.
    assert sent[1].deltas == [] and sent[1].steps == 2
    assert [len(o.deltas) for o in sent[2:]] == [1, 1] and sent[-1].deltas[0].finished
    assert sent[-1].metrics is not None and sent[-1].metrics.running_requests == 0


def test_idle_engine_takes_a_burst_before_its_first_step() -> None:
    """Requests arriving one by one right behind the one that woke an idle engine all join its
    first step (one prefill batch); a busy engine never waits for more."""
    from radixkv.server.engine_link.engine_core import AddCmd, EngineCore, Outputs, StopCmd

    def add(rid: str) -> AddCmd:
        return AddCmd(rid, [5, 6, 7], SamplingParams(max_tokens=2), NO_OPTIONS)

    arrivals: list[list[Any]] = [[add("a")], [add("b")], [add("c")], [], [add("late")]]
    timeouts: list[float] = []

    def recv(timeout: float) -> list[Any]:
        timeouts.append(timeout)
        return arrivals.pop(0) if arrivals else [StopCmd()]

    sent: list[Outputs] = []
    engine = FakeEngine()
    assert EngineCore(engine).run(recv, sent.append) is None
    assert [rid for rid, _ in sent[0].accepted] == ["a", "b", "c"]
    assert sent[0].metrics is not None and sent[0].metrics.running_requests == 3
    # The burst ended at the first empty receive; "late" came with the busy engine's next
    # non-blocking poll, not by waiting.
    assert timeouts[:4] == [0.5, 0.003, 0.003, 0.003] and timeouts[4] == 0.0
    assert [rid for rid, _ in sent[1].accepted] == ["late"]


def test_engine_process_keeps_freed_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine process tunes glibc's malloc (applied on glibc, off with the variable)."""
    import platform

    from radixkv.server.engine_link.engine_proc_main import keep_freed_memory

    if platform.libc_ver()[0] == "glibc":
        assert keep_freed_memory() is True
    monkeypatch.setenv("RADIXKV_MALLOC_TUNE", "0")
    assert keep_freed_memory() is False

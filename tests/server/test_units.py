"""Unit tests: AsyncEngine without HTTP, session table bounds, strict body parsing."""

from __future__ import annotations

import asyncio

import pytest
from server_fakes import FakeEngine

from radixkv.engine.types import RequestError, RequestOptions, SamplingParams, StreamDelta
from radixkv.server.engine_link.async_engine import AsyncEngine
from radixkv.server.openai.protocol import APIError, CompletionRequest, parse_body
from radixkv.server.sessions import SessionTracker


class BoolAbortEngine(FakeEngine):
    """Like the real Engine: abort() returns a bool and the abort delta comes with the next step."""

    def __init__(self) -> None:
        super().__init__(step_delay=0.002)
        self.pending: list[StreamDelta] = []

    def abort(self, request_id: str) -> bool:  # type: ignore[override]
        delta = super().abort(request_id)
        if delta is not None:
            self.pending.append(delta)
        return delta is not None

    def step(self) -> list[StreamDelta]:
        out, self.pending = self.pending, []
        return out + super().step()

    def has_unfinished(self) -> bool:
        return bool(self.pending) or super().has_unfinished()


@pytest.mark.parametrize("engine_cls", [FakeEngine, BoolAbortEngine])
def test_abort_closes_stream_once(engine_cls: type[FakeEngine]) -> None:
    async def scenario() -> list[StreamDelta]:
        eng = engine_cls() if engine_cls is BoolAbortEngine else engine_cls(step_delay=0.002)
        ae = AsyncEngine(eng)
        ae.start()
        try:
            sp = SamplingParams(max_tokens=400)
            stream = await ae.submit("r1", [10, 11, 12], sp, RequestOptions())
            got = [await stream.get()]
            ae.abort("r1")
            while not got[-1].finished:
                got.append(await asyncio.wait_for(stream.get(), 5))
            await asyncio.sleep(0.05)  # a late engine abort delta must not reopen anything
            assert ae.inflight == 0 and stream.empty()
            assert not eng.running
            return got
        finally:
            await ae.stop()

    deltas = asyncio.run(scenario())
    assert deltas[-1].finish_reason == "abort"
    assert sum(d.finished for d in deltas) == 1


def test_rejected_add_raises_and_frees_slot() -> None:
    async def scenario() -> None:
        ae = AsyncEngine(FakeEngine())
        ae.start()
        try:
            with pytest.raises(RequestError) as exc:
                await ae.submit("r", [1] * 600, SamplingParams(max_tokens=1), RequestOptions())
            assert exc.value.code == 400 and ae.inflight == 0
            ok = await ae.submit("r", [5], SamplingParams(max_tokens=1), RequestOptions())
            assert (await ok.get()).finished
        finally:
            await ae.stop()

    asyncio.run(scenario())


def test_session_table_is_bounded_lru() -> None:
    t = SessionTracker(max_sessions=3)
    for sid in "abcd":
        t.record(sid, 10, 5, 1)
    assert t.get("a") is None and len(t) == 3
    t.record("b", 10, 10, 1)  # b is now most recent; c is the oldest
    t.record("e", 1, 0, 1)
    assert t.get("c") is None and t.get("b") is not None
    b = t.get("b")
    assert b is not None and b.requests == 2 and b.token_hit_rate == 0.75


def test_parse_body_names_the_field() -> None:
    with pytest.raises(APIError) as exc:
        parse_body(CompletionRequest, b'{"prompt": "x", "top_k": 1.5}')
    assert exc.value.status == 400 and exc.value.param == "top_k"
    with pytest.raises(APIError) as exc:
        parse_body(CompletionRequest, b'{"prompt": "x", "stop": [1]}')
    assert exc.value.param == "stop"
    req = parse_body(CompletionRequest, b'{"prompt": ["only one"], "unknown_field": 1}')
    assert req.prompt_text_or_ids() == "only one"


def test_engine_bug_in_add_is_a_500_not_a_dead_loop() -> None:
    class Buggy(FakeEngine):
        def add_request(self, prompt_ids, sampling, request_id=None, options=None):  # type: ignore[no-untyped-def, override]
            if prompt_ids == [13]:
                raise TypeError("boom")
            return super().add_request(
                prompt_ids, sampling, request_id, options or RequestOptions()
            )

    async def scenario() -> None:
        ae = AsyncEngine(Buggy())
        ae.start()
        try:
            with pytest.raises(RequestError) as exc:
                await ae.submit("a", [13], SamplingParams(max_tokens=1), RequestOptions())
            assert exc.value.code == 500 and "boom" in str(exc.value)
            assert ae.alive and ae.inflight == 0
            ok = await ae.submit("b", [5], SamplingParams(max_tokens=1), RequestOptions())
            assert (await ok.get()).finished
        finally:
            await ae.stop()

    asyncio.run(scenario())


def test_component_pools_are_exported_per_pool_and_owner() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from radixkv.engine.types import EngineMetrics
    from radixkv.server.metrics import ServerMetrics

    pools = {
        "full": {"size": 64, "free": 40, "cached": 16, "held": 8},
        "swa": {"size": 32, "free": 20, "cached": 8, "held": 4},
        "state": {"size": 10, "free": 6, "cached": 3, "held": 1},
    }
    m = EngineMetrics(1, 0, 64, 40, 16, 16, 10, 5, 3, 0, 1, component_pools=pools)
    text = ServerMetrics(lambda: m).render().decode()
    fam = {f.name: f for f in text_string_to_metric_families(text)}["radixkv_component_pool_slots"]
    got = {(s.labels["pool"], s.labels["owner"]): s.value for s in fam.samples}
    assert got == {(p, o): float(v) for p, row in pools.items() for o, v in row.items()}

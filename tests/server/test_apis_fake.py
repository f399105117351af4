"""The agent APIs' server mechanics against the FakeEngine (fast): the API key as Anthropic's
clients send it (`x-api-key`) and errors in Anthropic's shape, an engine that fails mid-stream
(`response.failed` / an `error` event, never a hung stream), a client that leaves mid-stream
(its request aborted, its memory returned), and the sessions / cache extensions passed through."""

from __future__ import annotations

import json
import time

import anthropic
import httpx
import openai
import pytest
from server_fakes import FakeEngine
from server_harness import MODES, LiveServer, fake_server, live_server

from radixkv.engine.types import EngineConfig

BIG = EngineConfig(num_slots=1 << 16, max_model_len=4096)
ASK = [{"role": "user", "content": "a shared question"}]


def _idle(srv: LiveServer, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = httpx.get(srv.url + "/cache/stats", timeout=10).json()
        if stats["inflight_requests"] == 0 and stats["running_requests"] == 0:
            return stats
        assert time.monotonic() < deadline, stats
        time.sleep(0.02)


def test_api_key_as_x_api_key_or_bearer_and_anthropic_401s() -> None:
    with live_server(FakeEngine(), api_key="sekret") as srv:
        good = anthropic.Anthropic(base_url=srv.url, api_key="sekret", max_retries=0)
        m = good.messages.create(model="test-model", max_tokens=3, messages=ASK)
        assert m.usage.output_tokens == 3
        bad = anthropic.Anthropic(base_url=srv.url, api_key="wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as info:
            bad.messages.create(model="test-model", max_tokens=3, messages=ASK)
        assert info.value.body == {  # Anthropic's shape under /v1/messages
            "type": "error",
            "error": {
                "type": "authentication_error",
                "message": info.value.body["error"]["message"],
            },  # type: ignore[index]
        }
        oai = openai.OpenAI(base_url=srv.url + "/v1", api_key="sekret", max_retries=0)
        assert oai.responses.create(model="test-model", input="hi", max_output_tokens=2).id
        with pytest.raises(openai.AuthenticationError) as oinfo:
            openai.OpenAI(base_url=srv.url + "/v1", api_key="no", max_retries=0).responses.create(
                model="test-model", input="hi"
            )
        assert oinfo.value.code == "invalid_api_key"  # OpenAI's shape elsewhere
        r = httpx.get(srv.url + "/v1/models", headers={"x-api-key": "sekret"})
        assert r.status_code == 200


@pytest.mark.parametrize("mode", MODES)
def test_an_engine_failure_ends_both_streams_with_an_error(mode: str) -> None:
    with fake_server(mode, step_delay=0.01, fail_at_step=5) as srv:
        body = {"model": "test-model", "input": "hello", "max_output_tokens": 200, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/responses", json=body, timeout=10) as r:
            events = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: ")]
        assert events[0]["type"] == "response.created"
        assert events[-1]["type"] == "response.failed"
        assert events[-1]["response"]["status"] == "failed"
        assert events[-1]["response"]["error"]["message"]
    with fake_server(mode, step_delay=0.01, fail_at_step=5) as srv:
        client = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0)
        with (
            pytest.raises(anthropic.APIStatusError),
            client.messages.stream(model="test-model", max_tokens=200, messages=ASK) as stream,
        ):
            for _ in stream:
                pass


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/messages"])
def test_a_client_leaving_mid_stream_aborts_its_request(path: str) -> None:
    with fake_server("thread", config=BIG, step_delay=0.005) as srv:
        body = {"model": "test-model", "input": "hi", "messages": ASK, "stream": True,
                "max_tokens": 3000, "max_output_tokens": 3000, "ignore_eos": True}  # fmt: skip
        for _ in range(3):
            with httpx.stream("POST", srv.url + path, json=body, timeout=10) as r:
                lines = r.iter_lines()
                for _ in range(12):
                    next(lines)
        stats = _idle(srv)
        assert stats["memory_check"] == "ok"
        assert stats["generated_tokens_total"] < 3 * 3000  # nobody ran to the end


def test_extensions_pass_through_to_the_engine() -> None:
    """session_id and cache_salt reach the engine as on chat completions."""
    with fake_server("thread") as srv:
        for _ in range(2):
            body = {"model": "test-model", "max_tokens": 2, "messages": ASK, "session_id": "s"}
            assert httpx.post(srv.url + "/v1/messages", json=body).status_code == 200
            body = {"model": "test-model", "input": "q", "max_output_tokens": 2,
                    "session_id": "s", "cache_salt": "tenant"}  # fmt: skip
            assert httpx.post(srv.url + "/v1/responses", json=body).status_code == 200
        session = httpx.get(srv.url + "/sessions/s").json()
        assert session["requests"] == 4 and session["cached_tokens"] > 0


def test_unknown_routes_under_messages_answer_in_anthropics_shape() -> None:
    with fake_server("thread") as srv:
        r = httpx.post(srv.url + "/v1/messages/batches", json={})
        assert r.status_code in (404, 405)
        assert r.json()["type"] == "error" and "error" in r.json()
        r = httpx.post(srv.url + "/v1/messages", content=b"{not json")
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"

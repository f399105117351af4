"""Every bad input gets its status and an OpenAI-style error body; the server keeps serving.

Runs against the small contract-following FakeEngine (fast, no model): validation happens in the
server before the engine is involved, except the engine's own RequestErrors (too long, overload),
which the fake raises the same way the real engine does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_fakes import FakeEngine
from server_harness import MODES, LiveServer, fake_server, live_server

from radixkv.engine.types import EngineConfig


@pytest.fixture(scope="module")
def srv() -> Iterator[LiveServer]:
    cfg = EngineConfig(num_slots=4096, max_model_len=64, max_queued_requests=8)
    with live_server(FakeEngine(cfg), "fake-model") as server:
        yield server


def _post(srv: LiveServer, path: str, body: Any, raw: bytes | None = None) -> httpx.Response:
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(srv.url + path, content=content, timeout=10)


def _assert_error(resp: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param, err
    return err


OK = {"model": "fake-model", "prompt": "hi", "max_tokens": 2}
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

BAD_COMPLETIONS = [
    ({**OK, "max_tokens": 0}, 400, "max_tokens"),
    ({**OK, "max_tokens": -3}, 400, "max_tokens"),
    ({**OK, "max_tokens": "ten"}, 400, "max_tokens"),
    ({**OK, "temperature": "hot"}, 400, "temperature"),
    ({**OK, "temperature": -1.0}, 400, "temperature"),
    ({**OK, "top_p": 0.0}, 400, "top_p"),
    ({**OK, "stream": "yes"}, 400, "stream"),
    ({**OK, "n": 0}, 400, "n"),
    ({**OK, "logprobs": 21}, 400, "logprobs"),  # above the top-20 cap
    ({**OK, "logprobs": 2, "echo": True}, 400, "echo"),  # prompt logprobs are not computed
    ({**OK, "logit_bias": {"999999": 5}}, 400, "logit_bias"),
    ({**OK, "logit_bias": {"5": 500}}, 400, "logit_bias"),
    ({**OK, "frequency_penalty": -2.5}, 400, "frequency_penalty"),
    ({**OK, "repetition_penalty": 0.0}, 400, "repetition_penalty"),
    ({**OK, "prompt": [5, 7, 100000]}, 400, "prompt"),
    ({**OK, "prompt": [5, -1]}, 400, "prompt"),
    ({**OK, "prompt": [5, "x"]}, 400, "prompt"),
    ({**OK, "prompt": ""}, 400, "prompt"),
    ({**OK, "prompt": "x" * 100}, 400, "prompt"),  # longer than the context (64)
    ({**OK, "prompt": "x" * 60, "max_tokens": 10}, 400, "max_tokens"),  # + output: too long
    ({**OK, "stop_token_ids": [999999]}, 400, "stop_token_ids"),
    ({"model": "fake-model", "max_tokens": 2}, 400, "prompt"),
    ({**OK, "model": "gpt-4"}, 404, "model"),
]


@pytest.mark.parametrize(("body", "status", "param"), BAD_COMPLETIONS)
def test_bad_completion_inputs(srv: LiveServer, body: Any, status: int, param: str) -> None:
    _assert_error(_post(srv, "/v1/completions", body), status, param)


def test_too_long_is_context_length_exceeded(srv: LiveServer) -> None:
    err = _assert_error(_post(srv, "/v1/completions", {**OK, "prompt": "x" * 100}), 400)
    assert err["code"] == "context_length_exceeded"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({**CHAT, "messages": []}, 400, "messages"),
        ({**CHAT, "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.role"),
        ({**CHAT, "messages": "hello"}, 400, "messages"),
        ({**CHAT, "n": 0}, 400, "n"),
        ({**CHAT, "top_logprobs": 2}, 400, "top_logprobs"),  # needs logprobs=true
        ({**CHAT, "logprobs": True, "top_logprobs": 30}, 400, "logprobs"),
        ({**CHAT, "logit_bias": {"five": 10}}, 400, "logit_bias"),
        ({**CHAT, "response_format": {"type": "xml"}}, 400, "response_format"),
        ({**CHAT, "response_format": {"type": "json_schema"}}, 400, "response_format"),
        ({**CHAT, "presence_penalty": 2.5}, 400, "presence_penalty"),
        ({**CHAT, "max_completion_tokens": 0}, 400, "max_completion_tokens"),
        ({**CHAT, "max_tokens": 0}, 400, "max_tokens"),
        ({**CHAT, "model": "nope"}, 404, "model"),
        ({**CHAT, "messages": [{"role": "user", "content": "x" * 80}]}, 400, "messages"),
    ],
)
def test_bad_chat_inputs(srv: LiveServer, body: Any, status: int, param: str) -> None:
    _assert_error(_post(srv, "/v1/chat/completions", body), status, param)


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b'"a string"', b"\xff\xfe"])
def test_malformed_json(srv: LiveServer, raw: bytes) -> None:
    for path in ("/v1/completions", "/v1/chat/completions"):
        _assert_error(_post(srv, path, None, raw=raw), 400)


def test_oversized_body_is_413(srv: LiveServer) -> None:
    big = b'{"prompt": "' + b"x" * (33 * 2**20) + b'"}'
    _assert_error(_post(srv, "/v1/completions", None, raw=big), 413)


def test_unknown_route_and_method(srv: LiveServer) -> None:
    _assert_error(httpx.get(srv.url + "/v1/nothing"), 404)
    _assert_error(httpx.get(srv.url + "/v1/completions"), 405)
    _assert_error(httpx.get(srv.url + "/sessions/never-seen"), 404)


def test_still_serving_after_errors(srv: LiveServer) -> None:
    for body, _, _ in BAD_COMPLETIONS:
        _post(srv, "/v1/completions", body)
    resp = _post(srv, "/v1/completions", OK)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["finish_reason"] == "length"
    stats = httpx.get(srv.url + "/cache/stats").json()
    assert stats["memory_check"] == "ok"
    assert stats["running_requests"] == 0 and stats["inflight_requests"] == 0


@pytest.mark.parametrize("mode", MODES)
def test_overload_is_503_with_clear_message(mode: str) -> None:
    # A slow engine with room for 2 requests in flight: the third is refused immediately.
    cfg = EngineConfig(num_slots=4096, max_model_len=512, max_running_requests=1)
    with fake_server(mode, "m", config=cfg, step_delay=0.02) as server:
        server.state.engine.max_inflight = 2
        body = {"model": "m", "prompt": "hi", "max_tokens": 40, "stream": True}
        with httpx.Client(base_url=server.url, timeout=10) as client:
            streams = [client.stream("POST", "/v1/completions", json=body) for _ in range(2)]
            responses = [s.__enter__() for s in streams]
            try:
                assert all(r.status_code == 200 for r in responses)
                refused = client.post("/v1/completions", json={**body, "stream": False})
                err = _assert_error(refused, 503)
                assert err["code"] == "overloaded" and "overloaded" in err["message"]
            finally:
                for s in streams:
                    s.__exit__(None, None, None)
        ok = httpx.post(server.url + "/v1/completions", json={**body, "stream": False}, timeout=10)
        assert ok.status_code == 200

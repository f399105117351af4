"""Server mechanics against the FakeEngine: disconnects abort, crashes fail cleanly, sessions,
auth, metrics. Each behaviour runs in both engine modes (`mode`): the engine object on a loop
thread, and the engine in its own process behind ZeroMQ. (The same behaviours are exercised
end-to-end on the real engine in test_e2e and test_e2e_process.)"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_fakes import FakeEngine
from server_harness import MODES, LiveServer, fake_server, live_server

from radixkv.engine.types import EngineConfig


def _wait_idle(srv: LiveServer, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = httpx.get(srv.url + "/cache/stats", timeout=10).json()
        if stats["inflight_requests"] == 0 and stats["running_requests"] == 0:
            return stats
        assert time.monotonic() < deadline, stats
        time.sleep(0.02)


BIG = EngineConfig(num_slots=1 << 16, max_model_len=4096)


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_disconnecting_streams_are_aborted(mode: str) -> None:
    with fake_server(mode, config=BIG, step_delay=0.005) as srv:
        body = {"prompt": "shared prefix " * 4, "max_tokens": 2000, "stream": True}
        with httpx.Client(base_url=srv.url, timeout=10) as client:
            for _ in range(8):
                with client.stream("POST", "/v1/completions", json=body) as resp:
                    assert resp.status_code == 200
                    first = next(resp.iter_lines())
                    assert first.startswith("data: ")
                # leaving the block closes the connection mid-stream
        stats = _wait_idle(srv)
        assert stats["memory_check"] == "ok"
        assert stats["generated_tokens_total"] < 8 * 2000  # nobody ran to the end
        families = {f.name: f for f in text_string_to_metric_families(_metrics(srv))}
        aborted = [
            s.value
            for s in families["radixkv_requests_finished"].samples
            if s.labels.get("reason") == "abort" and s.name.endswith("_total")
        ]
        assert aborted == [8.0]


@pytest.mark.parametrize("stream", [True, False])
def test_hang_up_right_after_sending(mode: str, stream: bool) -> None:
    """Clients that close the socket before reading a byte: every request is still aborted."""
    with fake_server(mode, config=BIG, step_delay=0.005) as srv:
        payload = json.dumps({"prompt": "bye", "max_tokens": 3000, "stream": stream}).encode()
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode()
        for _ in range(6):
            with socket.create_connection(("127.0.0.1", srv.port)) as sock:
                sock.sendall(head + payload)
                time.sleep(0.05)  # let the server accept it, then vanish without reading
        stats = _wait_idle(srv)
        assert stats["memory_check"] == "ok"
        assert stats["generated_tokens_total"] < 3000 and stats["finished_requests"] == 6


def test_non_stream_client_timeout_aborts() -> None:
    eng = FakeEngine(EngineConfig(num_slots=1 << 16, max_model_len=4096), step_delay=0.005)
    with live_server(eng) as srv:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3000}, timeout=0.3
            )
        t0 = time.monotonic()
        _wait_idle(srv)
        assert time.monotonic() - t0 < 5  # would take >= 15 s if it ran to the end
        assert eng.generated < 3000


def test_engine_crash_fails_requests_and_health(mode: str) -> None:
    with fake_server(mode, step_delay=0.01, fail_at_step=5) as srv:
        body = {"prompt": "hello", "max_tokens": 200, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=10) as resp:
            lines = resp.iter_lines()
            assert next(lines).startswith("data: ")
            events = [ln for ln in lines if ln.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert "error" in json.loads(events[-2][6:])
        assert httpx.get(srv.url + "/health").status_code == 503
        resp2 = httpx.post(srv.url + "/v1/completions", json={"prompt": "x"}, timeout=5)
        assert resp2.status_code == 503 and resp2.json()["error"]["type"] == "server_error"


def test_api_key_required_except_health() -> None:
    with live_server(FakeEngine(), api_key="sekret") as srv:
        assert httpx.get(srv.url + "/health").status_code == 200
        for method, path in [
            ("GET", "/v1/models"),
            ("POST", "/v1/completions"),
            ("GET", "/metrics"),
        ]:
            resp = httpx.request(method, srv.url + path, json={"prompt": "x"})
            assert resp.status_code == 401
            assert resp.json()["error"]["code"] == "invalid_api_key"
        bad = httpx.get(srv.url + "/v1/models", headers={"Authorization": "Bearer wrong"})
        assert bad.status_code == 401
        good = httpx.get(srv.url + "/v1/models", headers={"Authorization": "Bearer sekret"})
        assert good.status_code == 200 and good.json()["data"][0]["id"] == "test-model"


def test_sessions_and_flush(mode: str) -> None:
    with fake_server(mode) as srv:
        body = {"prompt": "a long shared system prompt", "max_tokens": 3, "session_id": "s1"}
        for _ in range(3):
            assert httpx.post(srv.url + "/v1/completions", json=body).status_code == 200
        s = httpx.get(srv.url + "/sessions/s1").json()
        assert s["requests"] == 3 and s["prompt_tokens"] == 3 * 27
        assert s["cached_tokens"] == 2 * 26 and not s["closed"]
        assert s["token_hit_rate"] == pytest.approx(52 / 81, abs=1e-5)
        closed = httpx.post(srv.url + "/sessions/s1/close").json()
        assert closed["closed"] and closed["requests"] == 3
        assert httpx.post(srv.url + "/sessions/nope/close").status_code == 404
        flushed = httpx.post(srv.url + "/flush_cache").json()
        assert flushed["flushed"] and flushed["cached_tokens_in_tree"] == 0
        after = httpx.post(srv.url + "/v1/completions", json=body).json()
        assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        reopened = httpx.get(srv.url + "/sessions/s1").json()
        assert reopened["requests"] == 1 and not reopened["closed"]


def _metrics(srv: LiveServer) -> str:
    resp = httpx.get(srv.url + "/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    return resp.text


def test_metrics_parse_and_track_requests(mode: str) -> None:
    with fake_server(mode) as srv:
        body = {"prompt": "shared prefix here", "max_tokens": 2}
        for _ in range(2):
            httpx.post(srv.url + "/v1/completions", json=body)
        httpx.post(srv.url + "/v1/completions", json={**body, "max_tokens": 0})
        families = {f.name: f for f in text_string_to_metric_families(_metrics(srv))}
        for name in (
            "radixkv_token_hit_rate",
            "radixkv_cached_prompt_tokens",
            "radixkv_prompt_tokens",
            "radixkv_pool_usage",
            "radixkv_evictable_tokens",
            "radixkv_running_requests",
            "radixkv_waiting_requests",
            "radixkv_time_to_first_token_seconds",
            "radixkv_http_requests",
        ):
            assert name in families, name

        def value(fam: str, sample: str, **labels: str) -> float:
            return next(
                s.value
                for s in families[fam].samples
                if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
            )

        assert (
            value(
                "radixkv_time_to_first_token_seconds", "radixkv_time_to_first_token_seconds_count"
            )
            == 2
        )
        assert value("radixkv_prompt_tokens", "radixkv_prompt_tokens_total") == 36
        assert value("radixkv_cached_prompt_tokens", "radixkv_cached_prompt_tokens_total") == 17
        assert value("radixkv_token_hit_rate", "radixkv_token_hit_rate") == pytest.approx(17 / 36)
        http = "radixkv_http_requests_total"
        assert value("radixkv_http_requests", http, route="/v1/completions", status="200") == 2
        assert value("radixkv_http_requests", http, route="/v1/completions", status="400") == 1


class _GatedEngine(FakeEngine):
    """Its steps after the first block until the test opens `gate` (`blocked` says one is
    waiting): a step that never ends, whatever the machine's load."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.blocked = threading.Event()

    def step(self) -> list[Any]:
        if self.steps >= 1:
            self.blocked.set()
            self.gate.wait(30)
        return super().step()


def test_event_loop_not_blocked_by_engine_steps() -> None:
    """The server answers while an engine step is in progress: a step that runs on the event
    loop (or holds it) would leave /health unanswered until the gate opens, and every call
    below would time out."""
    eng = _GatedEngine()
    with live_server(eng) as srv, httpx.Client(base_url=srv.url, timeout=10) as client:
        body = {"prompt": "slow", "max_tokens": 4, "stream": True}
        try:
            with client.stream("POST", "/v1/completions", json=body) as resp:
                lines = resp.iter_lines()
                next(lines)  # the engine is now mid-generation
                assert eng.blocked.wait(10), "the engine never reached its second step"
                for _ in range(10):
                    assert client.get("/health", timeout=5).status_code == 200
                assert not eng.gate.is_set()  # answered while the step was still blocked
                eng.gate.set()
                assert [ln for ln in lines if ln][-1] == "data: [DONE]"
        finally:
            eng.gate.set()

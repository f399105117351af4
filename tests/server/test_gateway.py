"""What a router in front of several replicas reads from each one (radixkv.server.gateway), the
two /render routes, and the overload answer a router retries elsewhere: through the real app over
the FakeEngine, in both engine modes where the engine process matters. The same routes behind a
real SGLang Model Gateway are in tests/cluster/test_cluster_smg.py."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from server_fakes import FakeEngine, FakeTokenizer
from server_harness import MODES, LiveServer, fake_server, live_server

import radixkv
from radixkv.engine.types import EngineConfig
from radixkv.server.gateway import ThroughputMeter


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _get(srv: LiveServer, path: str, **kw: Any) -> Any:
    resp = httpx.get(srv.url + path, timeout=10, **kw)
    assert resp.status_code == 200, (path, resp.text)
    return resp.json()


def _post(srv: LiveServer, path: str, body: Any) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=10)


def test_server_info_model_info_version(mode: str) -> None:
    with fake_server(mode, "fake-model") as srv:
        info = _get(srv, "/server_info")
        assert _get(srv, "/get_server_info") == info  # SGLang's older name, same body
        assert info["served_model_name"] == "fake-model"
        assert info["version"] == radixkv.__version__
        assert info["context_length"] == 512 and info["max_total_tokens"] == 4096
        assert info["max_running_requests"] == 32 and info["max_queued_requests"] == 256
        assert (info["tp_size"], info["dp_size"], info["is_embedding"]) == (1, 1, False)
        # The fake has no checkpoint directory: no path a router would load a tokenizer from.
        assert "model_path" not in info and "tokenizer_path" not in info
        model = _get(srv, "/model_info")
        assert _get(srv, "/get_model_info") == model
        assert model["served_model_name"] == "fake-model" and model["is_generation"] is True
        assert "model_path" not in model
        assert _get(srv, "/version") == {"version": radixkv.__version__}
        card = _get(srv, "/v1/models")["data"][0]
        assert card["id"] == "fake-model" and card["max_model_len"] == 512
        assert "root" not in card  # smg would read it as a model path


def test_model_path_only_while_it_exists(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    )
    engine = FakeEngine()
    engine.lm = SimpleNamespace(path=ckpt)  # type: ignore[attr-defined]  # as the real Engine
    with live_server(engine, "m") as srv:
        info = _get(srv, "/server_info")
        assert info["model_path"] == info["tokenizer_path"] == str(ckpt)
        model = _get(srv, "/model_info")
        assert model["model_path"] == str(ckpt)
        assert model["architectures"] == ["LlamaForCausalLM"] and model["model_type"] == "llama"
        shutil.rmtree(ckpt)  # a path that is not there is never reported
        assert "model_path" not in _get(srv, "/server_info")
        model = _get(srv, "/model_info")
        assert "model_path" not in model and model["model_type"] == "llama"


# The fields smg's SchedulerLoadSnapshot reads, with their JSON types.
SMG_LOAD_FIELDS = {
    "dp_rank": int,
    "num_running_reqs": int,
    "num_waiting_reqs": int,
    "num_total_reqs": int,
    "num_used_tokens": int,
    "max_total_num_tokens": int,
    "token_usage": float,
    "gen_throughput": float,
    "cache_hit_rate": float,
    "max_running_requests": int,
}


def _load(srv: LiveServer) -> dict[str, Any]:
    body = _get(srv, "/v1/loads", params={"include": "core,disagg,queues,memory"})  # as smg asks
    assert body["dp_rank_count"] == 1 and body["version"] == radixkv.__version__
    assert isinstance(body["timestamp"], str) and body["timestamp"]
    (load,) = body["loads"]
    for name, kind in SMG_LOAD_FIELDS.items():
        assert isinstance(load[name], kind), (name, load)
    return dict(load)


def _poll(srv: LiveServer, cond: Any, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        load = _load(srv)
        if cond(load):
            return load
        assert time.monotonic() < deadline, load
        time.sleep(0.01)


def test_loads_in_smg_shape(mode: str) -> None:
    cfg = EngineConfig(num_slots=4096, max_model_len=512, max_running_requests=4)
    with fake_server(mode, config=cfg, step_delay=0.01) as srv:
        idle = _load(srv)
        assert idle["num_running_reqs"] == idle["num_waiting_reqs"] == 0
        assert idle["num_used_tokens"] == 0 and idle["token_usage"] == 0.0
        assert idle["max_total_num_tokens"] == 4096 and idle["max_running_requests"] == 4
        body = {"prompt": "a shared prefix " * 4, "max_tokens": 60, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=10) as resp:
            lines = resp.iter_lines()
            assert next(lines).startswith("data: ")
            busy = _poll(srv, lambda x: x["num_running_reqs"] == 1)
            assert busy["num_total_reqs"] == 1 and busy["num_used_tokens"] >= 64
            assert busy["token_usage"] == round(busy["num_used_tokens"] / 4096, 4)
            assert [ln for ln in lines if ln.startswith("data: ")][-1] == "data: [DONE]"
        # Finished: its tokens stay cached in the tree, evictable, so they are not "used" (a
        # warm cache must not look like a full replica to the router's KV-usage threshold).
        done = _poll(srv, lambda x: x["num_running_reqs"] == 0 and x["num_cached_tokens"] > 0)
        assert done["num_used_tokens"] == 0 and done["token_usage"] == 0.0
        assert done["num_cached_tokens"] == 64 + 60
        assert done["gen_throughput"] > 0  # 60 tokens since the first poll


def test_throughput_meter_window() -> None:
    meter = ThroughputMeter(window_s=10.0)
    assert meter.rate(0, now=100.0) == 0.0
    assert meter.rate(50, now=105.0) == pytest.approx(10.0)
    assert meter.rate(100, now=110.0) == pytest.approx(10.0)
    # Older samples leave the window: the rate is over the last ~10 s only.
    assert meter.rate(100, now=125.0) == pytest.approx(0.0)
    assert meter.rate(10, now=126.0) == 0.0  # the total went back: a restarted engine


def test_render_is_what_generation_runs(mode: str) -> None:
    tok = FakeTokenizer()
    with fake_server(mode, "m") as srv:
        body = {"model": "m", "prompt": "Hello radix", "max_tokens": 5, "cache_salt": "t1"}
        resp = _post(srv, "/v1/completions/render", {**body, "priority": 2, "stop": "x"})
        assert resp.status_code == 200, resp.text
        (out,) = resp.json()  # vLLM answers a list: one GenerateRequest per prompt
        assert out["token_ids"] == tok.encode("Hello radix")
        assert out["model"] == "m" and out["cache_salt"] == "t1" and out["priority"] == 2
        assert out["request_id"] and out["features"] is None and out["stream"] is False
        params = out["sampling_params"]
        assert params["max_tokens"] == 5 and params["stop"] == ["x"] and params["n"] == 1
        assert _get(srv, "/cache/stats")["prompt_tokens_total"] == 0  # nothing ran
        ran = _post(srv, "/v1/completions", body).json()
        assert ran["usage"]["prompt_tokens"] == len(out["token_ids"])
        (ids,) = _post(srv, "/v1/completions/render", {"prompt": [5, 6, 7]}).json()
        assert ids["token_ids"] == [5, 6, 7] and ids["sampling_params"]["max_tokens"] == 16

        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        chat = _post(srv, "/v1/chat/completions/render", {"messages": msgs}).json()
        assert chat["token_ids"] == tok.apply_chat_template(msgs, True)
        assert chat["sampling_params"]["max_tokens"] == min(512, 512 - len(chat["token_ids"]))
        capped = {"messages": msgs, "max_completion_tokens": 7, "stream": True}
        rendered = _post(srv, "/v1/chat/completions/render", capped).json()
        assert rendered["sampling_params"]["max_tokens"] == 7 and rendered["stream"] is True
        ran = _post(srv, "/v1/chat/completions", {"messages": msgs, "max_tokens": 3}).json()
        assert ran["usage"]["prompt_tokens"] == len(chat["token_ids"])


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/completions/render", {"model": "other", "prompt": "x"}, 404, "model"),
        ("/v1/completions/render", {"prompt": [999]}, 400, "prompt"),
        ("/v1/completions/render", {"prompt": "x" * 600}, 400, "prompt"),
        ("/v1/completions/render", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/chat/completions/render", {"messages": []}, 400, "messages"),
        ("/v1/chat/completions/render", {"messages": [{"role": "x"}]}, 400, None),
    ],
)
def test_render_refuses_what_generation_refuses(
    path: str, body: dict[str, Any], status: int, param: str | None
) -> None:
    with live_server(FakeEngine(), "m") as srv:
        resp = _post(srv, path, body)
        assert resp.status_code == status, resp.text
        if param is not None:
            assert resp.json()["error"]["param"] == param


@pytest.mark.parametrize("bound", ["server", "engine"])
def test_overload_is_503_with_retry_after(mode: str, bound: str) -> None:
    """Past the bound a request is refused at once with a 503 and Retry-After (SGLang's gateway
    retries a 503 on another worker): at the server (running + queued in flight), or by the
    engine (its waiting queue full)."""
    if bound == "server":  # room for 2 in flight
        cfg = EngineConfig(num_slots=4096, max_model_len=512, retry_after=3)
    else:  # the fake's queue takes 1
        cfg = EngineConfig(num_slots=4096, max_model_len=512, retry_after=3, max_queued_requests=1)
    with fake_server(mode, "m", config=cfg, step_delay=0.02) as srv:
        if bound == "server":
            srv.state.engine.max_inflight = 2
        held = 2 if bound == "server" else 1
        body = {"model": "m", "prompt": "hi", "max_tokens": 40, "stream": True}
        with httpx.Client(base_url=srv.url, timeout=10) as client:
            streams = [client.stream("POST", "/v1/completions", json=body) for _ in range(held)]
            responses = [s.__enter__() for s in streams]
            try:
                assert all(r.status_code == 200 for r in responses)
                refused = client.post("/v1/completions", json={**body, "stream": False})
                assert refused.status_code == 503, refused.text
                assert refused.headers["retry-after"] == "3"
                assert refused.json()["error"]["code"] == "overloaded"
                assert _get(srv, "/health") == {"status": "ok"}  # overloaded, not unhealthy
            finally:
                for s in streams:
                    s.__exit__(None, None, None)
        ok = httpx.post(srv.url + "/v1/completions", json={**body, "stream": False}, timeout=10)
        assert ok.status_code == 200 and "retry-after" not in ok.headers


def test_gateway_routes_need_the_api_key() -> None:
    key = {"Authorization": "Bearer sekret"}
    with live_server(FakeEngine(), "m", api_key="sekret") as srv:
        gets = ["/server_info", "/get_server_info", "/model_info", "/get_model_info", "/v1/loads"]
        for path in [*gets, "/version"]:
            assert httpx.get(srv.url + path).status_code == 401, path
            assert httpx.get(srv.url + path, headers=key).status_code == 200, path
        renders = {
            "/v1/completions/render": {"prompt": "x"},
            "/v1/chat/completions/render": {"messages": [{"role": "user", "content": "x"}]},
        }
        for path, body in renders.items():
            assert httpx.post(srv.url + path, json=body).status_code == 401, path
            assert httpx.post(srv.url + path, json=body, headers=key).status_code == 200, path
        assert httpx.get(srv.url + "/health").status_code == 200
        metrics = httpx.get(srv.url + "/metrics", headers=key).text
        assert 'radixkv_http_requests_total{route="/v1/loads",status="200"} 1.0' in metrics

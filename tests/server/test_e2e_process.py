"""End-to-end in process mode: the REAL engine (tiny seeded Llama, SmolLM2 tokenizer) in its own
process behind ZeroMQ, the HTTP server in this one, driven by the official `openai` client; and
`radixkv serve` as a subprocess: SIGTERM and kill -9 of the server leave no engine process behind,
a bad model path is a clear message and exit code 1."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_harness import LiveServer, live_server
from test_cli import SMALL, _free_port
from test_ipc import _running

from radixkv.bench.serving.server_proc import wait_healthy
from radixkv.engine.engine import Engine
from radixkv.engine.types import EngineConfig
from radixkv.server.engine_link.engine_proc import ProcessEngine

MODEL = "tiny-llama"
GREEDY: dict[str, Any] = {"temperature": 0.0, "max_tokens": 8}
SYSTEM = "You are a careful assistant. Answer briefly. The user is testing a radix tree cache."


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir: Callable[..., Path]) -> Path:
    return tiny_model_dir("llama")


def _process_engine(path: Path) -> ProcessEngine:
    config = EngineConfig(num_slots=4096, max_model_len=512, seed=0)
    return ProcessEngine(functools.partial(Engine, str(path), config)).launch()


@pytest.fixture(scope="module")
def srv(model_dir: Path) -> Iterator[LiveServer]:
    engine = _process_engine(model_dir)
    try:
        with live_server(engine, MODEL) as server:
            yield server
    finally:
        engine.close()


def _client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)


def _stats(server: LiveServer) -> dict[str, Any]:
    return httpx.get(server.url + "/cache/stats", timeout=30).json()


def test_streaming_and_not_match_in_process_engine(srv: LiveServer, model_dir: Path) -> None:
    client = _client(srv)
    messages: Any = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi!"}]
    kw: dict[str, Any] = {"model": MODEL, "messages": messages, "extra_body": {"ignore_eos": True}}
    full = client.chat.completions.create(**kw, **GREEDY)
    chunks = list(client.chat.completions.create(**kw, stream=True, **GREEDY))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert full.usage is not None and full.usage.completion_tokens == 8
    assert full.usage.prompt_tokens_details is not None
    # Same engine in this process: the same greedy text, token for token.
    local = Engine(str(model_dir), EngineConfig(num_slots=4096, max_model_len=512, seed=0))
    ids = local.tokenizer.apply_chat_template(messages)
    assert full.usage.prompt_tokens == len(ids)
    sp = local.generate(ids, _sampling(8))[0]
    assert sp.text == text
    # The second identical request is served from the radix cache (in the engine process).
    again = client.chat.completions.create(**kw, **GREEDY)
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == len(ids) - 1


def _sampling(n: int) -> Any:
    from radixkv.engine.types import SamplingParams

    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def test_disconnects_free_everything(srv: LiveServer) -> None:
    body = {"prompt": SYSTEM, "max_tokens": 400, "stream": True, "ignore_eos": True}
    before = _stats(srv)
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        for _ in range(4):
            with http.stream("POST", "/v1/completions", json=body) as resp:
                assert resp.status_code == 200
                lines = resp.iter_lines()
                next(lines)
    deadline = time.monotonic() + 30
    while (stats := _stats(srv))["inflight_requests"] or stats["running_requests"]:
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)
    assert stats["memory_check"] == "ok"
    assert stats["generated_tokens_total"] - before["generated_tokens_total"] < 4 * 400
    flushed = httpx.post(srv.url + "/flush_cache", timeout=30).json()
    assert flushed["flushed"] and flushed["free_slots"] == flushed["pool_slots"]


def test_dashboard_and_stats_cross_the_boundary(srv: LiveServer) -> None:
    _client(srv).completions.create(model=MODEL, prompt=SYSTEM, max_tokens=2)
    state = httpx.get(srv.url + "/dashboard/state", timeout=30).json()
    assert state["stats"]["pool_slots"] == 4096 and state["recent_total"] >= 1
    tree = httpx.get(srv.url + "/cache/tree", timeout=30)
    assert tree.status_code == 200
    stats = _stats(srv)
    assert stats["engine"]["pid"] != os.getpid() and stats["engine"]["steps"] > 0


def test_config_reports_the_engine_process_kernel_paths(srv: LiveServer) -> None:
    """/config's `resolved.kernel_paths` come from the engine's process (where the model runs),
    as `kernel_paths()` gives them there; benchmark reports record them."""
    from radixkv.model.kernels import kernel_paths

    reported = httpx.get(srv.url + "/config", timeout=30).json()["resolved"]["kernel_paths"]
    assert reported == kernel_paths()  # same machine, same environment: the same choice
    assert reported["cpu"] and reported["kernels"]


def test_killed_engine_is_503_and_ends_streams(model_dir: Path) -> None:
    engine = _process_engine(model_dir)
    try:
        with live_server(engine, MODEL) as server:
            assert httpx.get(server.url + "/health").status_code == 200
            body = {"prompt": "x", "max_tokens": 400, "stream": True, "ignore_eos": True}
            with httpx.stream("POST", server.url + "/v1/completions", json=body) as resp:
                lines = resp.iter_lines()
                assert next(lines).startswith("data: ")
                assert engine.pid is not None
                os.kill(engine.pid, signal.SIGKILL)
                events = [ln for ln in lines if ln.startswith("data: ")]
            assert events[-1] == "data: [DONE]"
            assert "exited unexpectedly" in json.loads(events[-2][6:])["error"]["message"]
            health = httpx.get(server.url + "/health")
            assert health.status_code == 503 and "exit code -9" in health.json()["error"]
            with pytest.raises(openai.InternalServerError) as exc:
                _client(server).completions.create(model=MODEL, prompt="hi", max_tokens=2)
            assert exc.value.status_code == 503
    finally:
        engine.close()


def _serve(model_dir: Path | str, port: int) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "radixkv", "serve", "--model", str(model_dir), *SMALL]
    cmd += ["--port", str(port), "--log-level", "warning", "--threads", "1"]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, IndexError):
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "kill"])
def test_serve_leaves_no_engine_process(model_dir: Path, how: str) -> None:
    port = _free_port()
    proc = _serve(model_dir, port)
    url = f"http://127.0.0.1:{port}"
    try:
        why = wait_healthy(url, proc, 300, 0.2, output=lambda: proc.communicate()[0])
        assert why is None, why
        (engine_pid,) = _children(proc.pid)
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
        r = client.completions.create(model=model_dir.name, prompt="hello", max_tokens=3)
        assert r.usage is not None and r.usage.completion_tokens >= 1
        if how == "ctrl-c":  # a terminal's Ctrl-C reaches the whole process group
            os.killpg(proc.pid, signal.SIGINT)
            assert proc.wait(60) == 0
            assert "Traceback" not in proc.communicate()[0]
        elif how == "sigterm":  # uvicorn shuts down gracefully, then re-raises the signal
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) in (0, -signal.SIGTERM)
        else:
            proc.kill()
            proc.wait(60)
        deadline = time.monotonic() + 60  # a liveness bound, not a performance check
        while _running(engine_pid):
            assert time.monotonic() < deadline, "the engine process outlived the server"
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait(30)


@pytest.mark.slow
def test_serve_bad_model_path_is_a_clear_error(tmp_path: Path) -> None:
    proc = _serve(tmp_path / "no-such-model", _free_port())
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1
    assert "the engine could not start" in out and "no-such-model" in out
    assert "Traceback" not in out


def test_n_logprobs_and_json_schema_cross_the_boundary(srv: LiveServer) -> None:
    """Fields other branches added to SamplingParams / StreamDelta need no transport change."""
    client = _client(srv)
    msgs: Any = [{"role": "user", "content": "A person as JSON."}]
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}},
        "required": ["name"],
        "additionalProperties": False,
    }
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    r = client.chat.completions.create(
        model=MODEL,
        messages=msgs,
        max_tokens=40,
        temperature=1.0,
        seed=3,
        n=2,
        logprobs=True,
        top_logprobs=2,
        response_format=fmt,
    )
    assert len(r.choices) == 2
    for c in r.choices:
        assert c.logprobs is not None and c.logprobs.content
        assert len(c.logprobs.content[0].top_logprobs) == 2
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content or ""), dict)

"""End-to-end: real uvicorn servers on 127.0.0.1 over the REAL engine (a tiny seeded Llama with
the SmolLM2 tokenizer), driven by the official `openai` client and raw HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_harness import LiveServer, live_server

from radixkv.engine.engine import Engine
from radixkv.engine.types import EngineConfig

MODEL = "tiny-llama"
SYSTEM = (
    "You are a careful assistant. Answer briefly, cite nothing, and keep every answer under "
    "twenty words. The user is testing a radix tree prefix cache."
)
GREEDY: dict[str, Any] = {"temperature": 0.0, "max_tokens": 8}
NO_EOS = {"ignore_eos": True}


def _engine(path: Path, **cfg: Any) -> Engine:
    base = {"num_slots": 4096, "max_model_len": 512, "seed": 0}
    return Engine(str(path), EngineConfig(**{**base, **cfg}))


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir: Callable[..., Path]) -> Path:
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def srv(model_dir: Path) -> Iterator[LiveServer]:
    with live_server(_engine(model_dir), MODEL) as server:
        yield server


@pytest.fixture(scope="module")
def srv_nocache(model_dir: Path) -> Iterator[LiveServer]:
    with live_server(_engine(model_dir, disable_radix_cache=True), MODEL) as server:
        yield server


def _client(server: LiveServer, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=60)


def _stats(server: LiveServer) -> dict[str, Any]:
    return httpx.get(server.url + "/cache/stats", timeout=30).json()


def test_completions_stream_and_not(srv: LiveServer) -> None:
    client = _client(srv)
    ids = srv.engine.tokenizer.encode("The capital of France")
    full = client.completions.create(model=MODEL, prompt="The capital of France", **GREEDY)
    assert full.object == "text_completion" and full.model == MODEL
    assert full.usage is not None and full.usage.prompt_tokens == len(ids)
    assert full.usage.completion_tokens >= 1
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="The capital of France",
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    # A token-id prompt is the same request.
    by_ids = client.completions.create(model=MODEL, prompt=ids, **GREEDY)
    assert by_ids.choices[0].text == full.choices[0].text


def test_chat_stream_and_not(srv: LiveServer) -> None:
    client = _client(srv)
    messages: Any = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi!"}]
    full = client.chat.completions.create(model=MODEL, messages=messages, **GREEDY)
    assert full.object == "chat.completion"
    assert full.choices[0].message.role == "assistant"
    chunks = list(
        client.chat.completions.create(model=MODEL, messages=messages, stream=True, **GREEDY)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason


def test_prefix_hit_and_identical_to_cache_off(srv: LiveServer, srv_nocache: LiveServer) -> None:
    on, off = _client(srv), _client(srv_nocache)
    assert httpx.post(srv.url + "/flush_cache", timeout=30).json()["cached_tokens_in_tree"] == 0
    questions = ["What is a radix tree?", "Why cache KV?", "What is a radix tree? Twice."]
    cached, prompts = [], []
    for q in questions:
        messages: Any = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
        kw: dict[str, Any] = {"model": MODEL, "messages": messages, "extra_body": NO_EOS}
        a = on.chat.completions.create(**kw, **GREEDY)
        b = off.chat.completions.create(**kw, **GREEDY)
        assert a.choices[0].message.content == b.choices[0].message.content
        assert a.usage is not None and b.usage is not None
        assert a.usage.prompt_tokens_details is not None
        assert b.usage.prompt_tokens_details is not None
        assert b.usage.prompt_tokens_details.cached_tokens == 0
        cached.append(a.usage.prompt_tokens_details.cached_tokens)
        prompts.append(srv.engine.tokenizer.apply_chat_template(messages))
    # Page size 1: each hit is exactly the longest prefix shared with an earlier prompt (the
    # system prompt, and for question 3 also the start of question 1).
    assert cached[0] == 0
    assert cached[1] == _lcp(prompts[0], prompts[1]) > 30
    assert cached[2] == max(_lcp(prompts[0], prompts[2]), _lcp(prompts[1], prompts[2]))
    assert cached[2] > cached[1]


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_cache_salt_isolates(srv: LiveServer) -> None:
    client = _client(srv)
    prompt = "Salted prefix: " + SYSTEM

    def cached(salt: str) -> int:
        r = client.completions.create(
            model=MODEL, prompt=prompt, extra_body={"cache_salt": salt}, **GREEDY
        )
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        return r.usage.prompt_tokens_details.cached_tokens

    assert cached("tenant-a") == 0
    assert cached("tenant-a") > 0
    assert cached("tenant-b") == 0  # same tokens, other namespace: nothing shared


def test_auth(model_dir: Path) -> None:
    with live_server(_engine(model_dir), MODEL, api_key="s3cret") as server:
        with pytest.raises(openai.AuthenticationError) as exc:
            _client(server, key="wrong").completions.create(model=MODEL, prompt="hi", max_tokens=1)
        assert exc.value.status_code == 401
        body: Any = exc.value.body
        assert body["code"] == "invalid_api_key"
        assert httpx.get(server.url + "/metrics").status_code == 401
        assert httpx.get(server.url + "/health").status_code == 200
        ok = _client(server, key="s3cret").completions.create(
            model=MODEL, prompt="hi", max_tokens=1
        )
        assert ok.usage is not None and ok.usage.completion_tokens == 1


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"prompt": [1, 2, 49152]}, 400, "prompt", "invalid_value"),  # vocab is 49152
        ({"prompt": "word " * 600}, 400, "prompt", "context_length_exceeded"),  # context 512
        ({"prompt": "hi", "max_tokens": 600}, 400, "max_tokens", None),  # prompt + output
        ({"prompt": "hi", "model": "gpt-4o"}, 404, "model", "model_not_found"),
        ({"prompt": "hi", "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
        ({"prompt": "hi", "n": 17}, 400, "n", None),  # above --max-n (16)
        ({"prompt": "hi", "temperature": "0"}, 400, "temperature", "invalid_type"),
    ],
)
def test_bad_inputs_real_engine(
    srv: LiveServer, body: dict[str, Any], status: int, param: str, code: str | None
) -> None:
    resp = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, **body}, timeout=30)
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and err["message"]
    if code is not None:
        assert err["code"] == code


def test_prompt_larger_than_pool(model_dir: Path) -> None:
    with live_server(_engine(model_dir, num_slots=64), MODEL) as server:
        resp = httpx.post(server.url + "/v1/completions", json={"prompt": "word " * 70})
        assert resp.status_code == 400, resp.text
        assert "pool" in resp.json()["error"]["message"]
        ok = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200


def _wait_idle(server: LiveServer, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        stats = _stats(server)
        idle = stats["inflight_requests"] == 0 and stats["running_requests"] == 0
        if idle and stats["waiting_requests"] == 0:
            return stats
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)


def test_disconnect_burst_leaves_pool_exact(srv: LiveServer) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Go"}],
        "max_tokens": 400,
        "stream": True,
        "ignore_eos": True,
    }
    before = _stats(srv)
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        streams = [client.stream("POST", "/v1/chat/completions", json=body) for _ in range(12)]
        responses = [s.__enter__() for s in streams]
        for i, resp in enumerate(responses):
            assert resp.status_code == 200
            if i % 3:  # two thirds read a few events first; the rest hang up at once
                lines = resp.iter_lines()
                for _ in range(3):
                    next(lines)
        for s in streams:
            s.__exit__(None, None, None)
    stats = _wait_idle(srv)
    assert stats["memory_check"] == "ok"
    assert stats["generated_tokens_total"] - before["generated_tokens_total"] < 12 * 400
    flushed = httpx.post(srv.url + "/flush_cache", timeout=30).json()
    assert flushed["flushed"]
    assert flushed["free_slots"] == flushed["pool_slots"]  # nothing leaked, nothing locked
    after = _client(srv).completions.create(model=MODEL, prompt="still serving", max_tokens=3)
    assert after.usage is not None and after.usage.completion_tokens >= 1


def test_metrics_parse_real_engine(srv: LiveServer) -> None:
    client = _client(srv)
    for _ in range(2):
        client.completions.create(model=MODEL, prompt="Metrics prefix " + SYSTEM, max_tokens=2)
    text = httpx.get(srv.url + "/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    hit_rate = fams["radixkv_token_hit_rate"].samples[0].value
    assert 0 < hit_rate < 1
    assert fams["radixkv_pool_slots"].samples[0].value == 4096
    ttft = [
        s for s in fams["radixkv_time_to_first_token_seconds"].samples if s.name.endswith("_count")
    ]
    assert ttft[0].value >= 2

"""End-to-end through a real uvicorn server and the official `openai` client: n > 1 forked from
one prefill, logprobs (against transformers), structured outputs, logit_bias, echo, and the
census after a client hangs up mid n > 1 stream. Tiny seeded Llama, SmolLM2 tokenizer."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
import torch
from server_harness import LiveServer, live_server

from radixkv.engine.engine import Engine
from radixkv.engine.types import EngineConfig

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
# 37 prompt tokens-ish: not a multiple of the page size, so the fork must handle a tail page.
PROMPT = "A radix tree shares prefixes. Parallel samples of one prompt should share it too."
NO_EOS = {"ignore_eos": True}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "ok", "color", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir: Callable[..., Path]) -> Path:
    return tiny_model_dir("llama")


def _engine(path: Path, **cfg: Any) -> Engine:
    base = {"num_slots": 4096, "max_model_len": 512, "seed": 0, "page_size": 16, "max_n": 8}
    return Engine(str(path), EngineConfig(**{**base, **cfg}))


@pytest.fixture(scope="module", params=["cache", "nocache"])
def srv(request: pytest.FixtureRequest, model_dir: Path) -> Iterator[LiveServer]:
    engine = _engine(model_dir, disable_radix_cache=request.param == "nocache")
    with live_server(engine, MODEL) as server:
        yield server


def _client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)


def _stats(server: LiveServer) -> dict[str, Any]:
    return httpx.get(server.url + "/cache/stats", timeout=30).json()


def _wait_idle(server: LiveServer, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        stats = _stats(server)
        busy = stats["inflight_requests"] + stats["running_requests"] + stats["waiting_requests"]
        if busy == 0:
            return stats
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)


def test_n3_greedy_equals_n1_and_prompt_computed_once(srv: LiveServer) -> None:
    client = _client(srv)
    prompt = PROMPT + " (greedy)"
    n_prompt = len(srv.engine.tokenizer.encode(prompt))
    one = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, temperature=0, extra_body=NO_EOS
    )
    httpx.post(srv.url + "/flush_cache", timeout=30)
    before = _stats(srv)
    three = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, temperature=0, n=3, extra_body=NO_EOS
    )
    after = _stats(srv)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert [c.text for c in three.choices] == [one.choices[0].text] * 3
    assert all(c.finish_reason == "length" for c in three.choices)
    assert three.usage is not None and three.usage.prompt_tokens == n_prompt
    assert three.usage.completion_tokens == 3 * 8
    # The prompt was computed once (cache on or off): the other two choices forked from it.
    assert after["prefill_tokens_total"] - before["prefill_tokens_total"] == n_prompt
    assert after["forked_choices_total"] - before["forked_choices_total"] == 2
    assert after["memory_check"] == "ok"


def test_n4_seeded_sampling_reproduces(srv: LiveServer) -> None:
    client = _client(srv)
    kw: dict[str, Any] = {"max_tokens": 10, "temperature": 1.0, "seed": 1234, "n": 4}
    msgs: Any = [{"role": "user", "content": "Say four different things."}]
    a = client.chat.completions.create(model=MODEL, messages=msgs, extra_body=NO_EOS, **kw)
    b = client.chat.completions.create(model=MODEL, messages=msgs, extra_body=NO_EOS, **kw)
    texts = [c.message.content for c in a.choices]
    assert texts == [c.message.content for c in b.choices]
    assert [c.index for c in a.choices] == [0, 1, 2, 3]
    assert len(set(texts)) > 1  # each choice has its own seed stream
    assert a.usage is not None and a.usage.completion_tokens == 40
    # Streaming the same request gives the same four texts, each with its own finish chunk.
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=msgs,
            extra_body=NO_EOS,
            stream=True,
            stream_options={"include_usage": True},
            **kw,
        )
    )
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 40 and usage.prompt_tokens > 0
    streamed = ["", "", "", ""]
    finish: dict[int, str] = {}
    for ch in chunks:
        for c in ch.choices:
            streamed[c.index] += c.delta.content or ""
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert streamed == texts and finish == {i: "length" for i in range(4)}


def test_n_above_cap_is_400(srv: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        _client(srv).completions.create(model=MODEL, prompt="x", max_tokens=2, n=9)
    assert "n=9" in str(exc.value) and "--max-n" in str(exc.value)


def _hf_logprobs(model_dir: Path, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def test_completion_logprobs_match_transformers(srv: LiveServer, model_dir: Path) -> None:
    client = _client(srv)
    ids = srv.engine.tokenizer.encode(PROMPT)
    kw: dict[str, Any] = {"max_tokens": 6, "temperature": 0.7, "seed": 3, "logprobs": 5}
    r = client.completions.create(model=MODEL, prompt=ids, extra_body=NO_EOS, **kw)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
    out_ids = [srv.engine.tokenizer.encode(t)[0] for t in lp.tokens]  # single-token texts
    ref = _hf_logprobs(model_dir, ids + out_ids)
    for j, tid in enumerate(out_ids):
        row = ref[len(ids) - 1 + j]
        assert abs(lp.token_logprobs[j] - float(row[tid])) < 1e-4
        top = sorted(lp.top_logprobs[j].values(), reverse=True)
        want = torch.topk(row, 5).values.tolist()
        assert len(top) <= 5 and all(abs(a - b) < 1e-4 for a, b in zip(top, want, strict=False))
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:j]) for j in range(len(lp.tokens))]
    # The same request streamed carries the same logprobs.
    stream = client.completions.create(
        model=MODEL, prompt=ids, stream=True, extra_body=NO_EOS, **kw
    )
    streamed: list[float] = []
    for ch in stream:
        for c in ch.choices:
            if c.logprobs is not None and c.logprobs.token_logprobs:
                streamed += c.logprobs.token_logprobs
    assert streamed == lp.token_logprobs


def test_chat_top_logprobs(srv: LiveServer, model_dir: Path) -> None:
    client = _client(srv)
    msgs: Any = [{"role": "user", "content": "Hello there"}]
    r = client.chat.completions.create(
        model=MODEL,
        messages=msgs,
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body=NO_EOS,
    )
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 5
    prompt_ids = srv.engine.tokenizer.apply_chat_template(msgs, True)
    out_ids = [srv.engine.tokenizer.encode(c.token)[0] for c in content]
    ref = _hf_logprobs(model_dir, prompt_ids + out_ids)
    for j, entry in enumerate(content):
        assert len(entry.top_logprobs) == 3
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert entry.token == entry.top_logprobs[0].token  # greedy picks the best
        assert abs(entry.logprob - float(ref[len(prompt_ids) - 1 + j][out_ids[j]])) < 1e-4
        assert bytes(entry.bytes or []).decode() == entry.token


def test_json_schema_outputs_validate_over_seeds(srv: LiveServer) -> None:
    client = _client(srv)
    fmt: Any = {
        "type": "json_schema",
        "json_schema": {"name": "p", "schema": SCHEMA, "strict": True},
    }
    msgs: Any = [{"role": "user", "content": "A person as JSON."}]
    seen = 0
    for seed in range(6):
        r = client.chat.completions.create(
            model=MODEL,
            messages=msgs,
            max_tokens=80,
            temperature=1.0,
            seed=seed,
            n=2,
            response_format=fmt,
        )
        for c in r.choices:
            text = c.message.content or ""
            assert c.finish_reason == "stop", text
            value = json.loads(text)
            jsonschema.validate(value, SCHEMA)
            assert list(value) == list(SCHEMA["properties"])  # keys in the schema's order
            assert ", " not in text.replace('", "', "")  # compact separators
            seen += 1
    assert seen == 12


def test_json_object_and_unsupported_schema(srv: LiveServer) -> None:
    client = _client(srv)
    msgs: Any = [{"role": "user", "content": "JSON please"}]
    r = client.chat.completions.create(
        model=MODEL,
        messages=msgs,
        max_tokens=6,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert (r.choices[0].message.content or "").startswith("{")
    bad: Any = {
        "type": "json_schema",
        "json_schema": {"name": "u", "schema": {"type": "array", "uniqueItems": True}},
    }
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=msgs, response_format=bad)
    assert "uniqueItems" in str(exc.value)
    assert _wait_idle(srv)["memory_check"] == "ok"


def test_logit_bias_and_echo(srv: LiveServer) -> None:
    client = _client(srv)
    tok = srv.engine.tokenizer.encode(" banana")[0]
    r = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=4,
        temperature=0,
        echo=True,
        logit_bias={str(tok): 100},
        extra_body=NO_EOS,
    )
    text = r.choices[0].text
    assert text.startswith(PROMPT) and text[len(PROMPT) :] == " banana" * 4


def test_disconnect_during_n_stream_frees_everything(srv: LiveServer) -> None:
    body = {
        "model": MODEL,
        "prompt": PROMPT + " (disconnect)",
        "max_tokens": 300,
        "n": 4,
        "stream": True,
        "ignore_eos": True,
    }
    with (
        httpx.Client(base_url=srv.url, timeout=30) as http,
        http.stream("POST", "/v1/completions", json=body) as resp,
    ):
        assert resp.status_code == 200
        lines = resp.iter_lines()
        for _ in range(6):
            next(lines)
    stats = _wait_idle(srv)
    assert stats["memory_check"] == "ok"
    flushed = httpx.post(srv.url + "/flush_cache", timeout=30).json()
    assert flushed["free_slots"] == flushed["pool_slots"]  # nothing leaked, nothing locked

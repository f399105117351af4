"""Tool calling end to end: the official `openai` client against a real server over the tiny
seeded Llama, whose text is noise, so only the grammar of `tool_choice` required / named can make
its calls valid: every one must parse and validate against its tool's schema. Also streamed
`tool_calls` deltas, a multi-turn loop that sends a tool result back, `auto`, `none`, and 400s.
The model gets a Hermes-style tool template (tool_model.py), so the server picks `hermes`."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from server_harness import LiveServer, live_server
from tool_model import SCHEMAS, WEATHER, tool_engine, with_tool_template

pytestmark = pytest.mark.slow

MODEL = "tiny-tools"
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": n, "description": f"{n} tool", "parameters": p}}
    for n, p in SCHEMAS.items()
]
ASK = [{"role": "user", "content": "What is the weather in Paris, and book a table for two."}]


@pytest.fixture(scope="module")
def tool_model_dir(
    tiny_model_dir: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return with_tool_template(tiny_model_dir("llama"), tmp_path_factory.mktemp("tiny-tools") / "m")


@pytest.fixture(scope="module")
def srv(tool_model_dir: Path) -> Iterator[LiveServer]:
    with live_server(tool_engine(tool_model_dir), MODEL) as server:
        assert server.state.tool_call_parser == "hermes"  # read from the template
        yield server


def _client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


def _valid(call: Any) -> dict[str, Any]:
    """The call's arguments, checked against its tool's schema."""
    assert call.type == "function" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_tool_choice_200_of_200_calls_validate(srv: LiveServer, choice: str) -> None:
    client = _client(srv)
    tool_choice: Any = choice
    if choice == "named":
        tool_choice = {"type": "function", "function": {"name": "book_table"}}
    names, calls = set(), 0
    for seed in range(25):
        r = client.chat.completions.create(
            model=MODEL, messages=ASK, tools=TOOLS, tool_choice=tool_choice, n=8,
            parallel_tool_calls=False, temperature=1.0, seed=seed, max_tokens=200,
        )  # fmt: skip
        for c in r.choices:
            assert c.finish_reason == "tool_calls", c.message
            assert c.message.content is None and len(c.message.tool_calls or []) == 1
            _valid(c.message.tool_calls[0])
            names.add(c.message.tool_calls[0].function.name)
            calls += 1
    assert calls == 200
    assert names == ({"book_table"} if choice == "named" else set(SCHEMAS))


def test_required_parallel_calls_each_validate(srv: LiveServer) -> None:
    r = _client(srv).chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", n=8,
        temperature=1.0, seed=7, max_tokens=400,
    )  # fmt: skip
    counts = []
    for c in r.choices:
        assert c.finish_reason == "tool_calls", c.message
        ids = [t.id for t in c.message.tool_calls or []]
        assert ids and len(set(ids)) == len(ids)
        for t in c.message.tool_calls or []:
            _valid(t)
        counts.append(len(ids))
    assert max(counts) >= 1


@pytest.mark.parametrize("choice", ["required", "named"])
def test_streamed_deltas_reassemble_to_the_same_calls(srv: LiveServer, choice: str) -> None:
    client = _client(srv)
    tool_choice: Any = choice
    if choice == "named":
        tool_choice = {"type": "function", "function": {"name": "get_weather"}}
    args: dict[str, Any] = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=tool_choice,
                                temperature=0, max_tokens=300)  # fmt: skip
    whole = client.chat.completions.create(**args).choices[0]
    calls: dict[int, dict[str, str]] = {}
    finish, pieces = None, 0
    for chunk in client.chat.completions.create(**args, stream=True):
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            assert not ch.delta.content
            for d in ch.delta.tool_calls or []:
                pieces += 1
                if d.index not in calls:  # the first delta of a call names it
                    assert d.id and d.type == "function" and d.function and d.function.name
                    calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
                else:
                    assert d.id is None and d.function and d.function.name is None
                calls[d.index]["arguments"] += (d.function and d.function.arguments) or ""
    assert finish == "tool_calls" and pieces > 2 * len(calls)  # arguments came in pieces
    want = [(t.function.name, t.function.arguments) for t in whole.message.tool_calls or []]
    assert [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)] == want


def test_multi_turn_loop_sends_the_tool_result_back(srv: LiveServer) -> None:
    client = _client(srv)
    messages: list[Any] = [{"role": "system", "content": "You are an agent."}, *ASK]
    for turn in range(3):
        r = client.chat.completions.create(
            model=MODEL, messages=messages, tools=TOOLS, tool_choice="required",
            parallel_tool_calls=False, temperature=1.0, seed=turn, max_tokens=200,
        )  # fmt: skip
        msg = r.choices[0].message
        call = msg.tool_calls[0]  # type: ignore[index]
        _valid(call)
        messages.append(msg.model_dump(exclude_none=True))
        result = json.dumps({"ok": True, "turn": turn})
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    rendered = httpx.post(
        srv.url + "/v1/chat/completions/render",
        json={"model": MODEL, "messages": messages, "tools": TOOLS},
        timeout=30,
    ).json()
    prompt = srv.state.tokenizer.decode(rendered["token_ids"], skip_special_tokens=False)
    assert prompt.count("<tool_call>") == 3 + 1  # three calls, plus the instructions
    assert prompt.count("<tool_response>") == 3 and '{"ok": true, "turn": 2}' in prompt
    assert '"name": "get_weather"' in prompt or '"name": "book_table"' in prompt
    final = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, max_tokens=8, temperature=0
    )  # tool_choice auto: the noise model answers in text
    assert final.choices[0].finish_reason in ("stop", "length")
    assert final.usage and final.usage.prompt_tokens_details
    assert final.usage.prompt_tokens_details.cached_tokens > 0  # the history came from the cache


# The Llama 3 JSON call shape, forced by response_format: under `auto` the server must read it as
# a call; under `none` it is content.
LLAMA3_CALL = {
    "type": "object",
    "properties": {"name": {"const": "get_weather"}, "parameters": WEATHER},
    "required": ["name", "parameters"],
    "additionalProperties": False,
}
RESPONSE_FORMAT: Any = {"type": "json_schema", "json_schema": {"name": "c", "schema": LLAMA3_CALL}}


@pytest.mark.parametrize("stream", [False, True])
def test_auto_reads_calls_with_the_configured_parser_and_none_does_not(
    srv: LiveServer, stream: bool
) -> None:
    client = _client(srv)
    srv.state.tool_call_parser = "llama3_json"  # as --tool-call-parser llama3_json sets it
    try:
        outs = {}
        for choice in ("auto", "none"):
            args: dict[str, Any] = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice,
                                        response_format=RESPONSE_FORMAT, temperature=0,
                                        max_tokens=200, stream=stream)  # fmt: skip
            outs[choice] = _answer(client.chat.completions.create(**args), stream)
    finally:
        srv.state.tool_call_parser = "hermes"
    content, calls, finish = outs["auto"]
    assert finish == "tool_calls" and not content and len(calls) == 1
    assert calls[0][0] == "get_weather"
    jsonschema.validate(json.loads(calls[0][1]), WEATHER)
    content, calls, finish = outs["none"]
    assert finish == "stop" and not calls
    assert json.loads(content)["parameters"] == json.loads(outs["auto"][1][0][1])


def _answer(r: Any, stream: bool) -> tuple[str, list[tuple[str, str]], str | None]:
    """(content, [(name, arguments)], finish_reason) of a response or a reassembled stream."""
    if not stream:
        c = r.choices[0]
        calls = [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []]
        return c.message.content or "", calls, c.finish_reason
    content, parts, finish = "", {}, None
    for chunk in r:
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            content += ch.delta.content or ""
            for d in ch.delta.tool_calls or []:
                part = parts.setdefault(d.index, ["", ""])
                part[0] += d.function.name or ""
                part[1] += d.function.arguments or ""
    return content, [(p[0], p[1]) for _, p in sorted(parts.items())], finish


def test_a_schema_the_grammar_cannot_enforce_is_400(srv: LiveServer) -> None:
    """Valid JSON Schema that llguidance does not implement: refused before anything runs."""
    params = {"type": "object", "properties": {"x": {"type": "string", "pattern": "(?<=a)b"}}}
    body = {
        "model": MODEL,
        "messages": ASK,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": params}}],
        "tool_choice": "required",
    }
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "tools" and "tool schema" in err["message"], err


def test_a_template_without_tools_is_400(tiny_model_dir: Callable[..., Path]) -> None:
    with live_server(tool_engine(tiny_model_dir("llama")), MODEL) as server:
        client = _client(server)
        for choice in ("auto", "required"):
            with pytest.raises(openai.BadRequestError) as info:
                client.chat.completions.create(
                    model=MODEL,
                    messages=ASK,
                    tools=TOOLS,
                    tool_choice=choice,
                    max_tokens=4,  # type: ignore[arg-type]
                )
            assert "tool" in str(info.value)
        # Without tools the same server still answers.
        r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4)
        assert r.choices[0].message.tool_calls is None

"""Anthropic's Messages API end to end: the official `anthropic` client against a real server
over the tiny seeded Llama with a Hermes tool template (tool_model.py). Its text is noise, so
only the grammar of `tool_choice` any / tool can make its calls valid: every `tool_use` input
must validate against its schema. Also: the same answer as /v1/chat/completions, Anthropic's
stream event sequence (and the client's stream helper), a tool_use / tool_result loop whose later
turns are served from the radix cache, stop sequences, count_tokens, and errors in Anthropic's
shape. (Newer clients no longer take `temperature`: it goes through `extra_body`.)"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest
from anthropic.types import Message
from server_harness import LiveServer, live_server
from tool_model import BOOK, SCHEMAS, tool_engine, with_tool_template

pytestmark = pytest.mark.slow

MODEL = "tiny-messages"
TOOLS: list[Any] = [
    {"name": n, "description": f"{n} tool", "input_schema": p} for n, p in SCHEMAS.items()
]
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris? Book a table too."}]
GREEDY: dict[str, Any] = {"extra_body": {"temperature": 0}}


@pytest.fixture(scope="module")
def srv(
    tiny_model_dir: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    path = with_tool_template(tiny_model_dir("llama"), tmp_path_factory.mktemp("msgs") / "m")
    with live_server(tool_engine(path), MODEL) as server:
        yield server


@pytest.fixture(scope="module")
def client(srv: LiveServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0, timeout=120)


def _uses(m: Any) -> list[Any]:
    """The message's tool_use blocks, each input checked against its tool's schema."""
    uses = [b for b in m.content if b.type == "tool_use"]
    for use in uses:
        assert use.id.startswith("toolu_")
        jsonschema.validate(use.input, SCHEMAS[use.name])
    return uses


def test_text_answer_is_the_chat_answer(srv: LiveServer, client: anthropic.Anthropic) -> None:
    body = {"model": MODEL, "max_tokens": 12, "system": [{"type": "text", "text": "Be brief."}],
            "messages": ASK, "temperature": 0, "ignore_eos": True}  # fmt: skip
    raw = httpx.post(srv.url + "/v1/messages", json=body, timeout=60).json()
    m = Message.model_validate(raw)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 12
    assert [b.type for b in m.content] == ["text"]
    oai = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    chat = oai.chat.completions.create(
        model=MODEL, max_tokens=12, temperature=0, extra_body={"ignore_eos": True},
        messages=[{"role": "system", "content": "Be brief."}, *ASK],
    )  # fmt: skip
    assert m.content[0].text == chat.choices[0].message.content  # type: ignore[union-attr]
    # Anthropic's split: computed + read from the cache = the whole prompt.
    assert chat.usage is not None and chat.usage.prompt_tokens_details is not None
    assert (m.usage.input_tokens or 0) + (m.usage.cache_read_input_tokens or 0) == (
        chat.usage.prompt_tokens
    )
    assert chat.usage.prompt_tokens_details.cached_tokens > 0  # the same prompt, run twice
    counted = client.messages.count_tokens(model=MODEL, system="Be brief.", messages=ASK)
    assert counted.input_tokens == chat.usage.prompt_tokens


@pytest.mark.parametrize("choice", ["any", "tool"])
def test_forced_tool_use_validates(client: anthropic.Anthropic, choice: str) -> None:
    tool_choice: Any = {"type": choice, "disable_parallel_tool_use": True}
    if choice == "tool":
        tool_choice["name"] = "book_table"
    names = set()
    for seed in range(12):
        m = client.messages.create(
            model=MODEL, max_tokens=200, messages=ASK, tools=TOOLS, tool_choice=tool_choice,
            extra_body={"temperature": 1.0, "seed": seed},
        )  # fmt: skip
        assert m.stop_reason == "tool_use"
        uses = _uses(m)
        assert len(uses) == 1 and len(m.content) == 1
        names.add(uses[0].name)
    assert names == ({"book_table"} if choice == "tool" else set(SCHEMAS))


def _raw_events(srv: LiveServer, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    events, kind = [], None
    with httpx.stream("POST", srv.url + "/v1/messages", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == kind
                events.append((kind, data))
    return events


def test_streamed_tool_use_follows_anthropics_event_sequence(
    srv: LiveServer, client: anthropic.Anthropic
) -> None:
    args: dict[str, Any] = dict(model=MODEL, max_tokens=300, messages=ASK, tools=TOOLS,
                                tool_choice={"type": "any"}, **GREEDY)  # fmt: skip
    whole = client.messages.create(**args)
    want = [(u.name, u.input) for u in _uses(whole)]
    body = {k: v for k, v in args.items() if k != "extra_body"}
    events = _raw_events(srv, {**body, "temperature": 0, "stream": True})
    kinds = [k for k, _ in events]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == [
        "message_delta",
        "message_stop",
    ]
    assert events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2][1]["usage"]["output_tokens"] == whole.usage.output_tokens
    got, pieces = [], 0
    for kind, data in events[2:-2]:
        if kind == "content_block_start":
            assert data["index"] == len(got) and data["content_block"]["input"] == {}
            got.append([data["content_block"]["name"], ""])
        elif kind == "content_block_delta":
            assert data["index"] == len(got) - 1
            assert data["delta"]["type"] == "input_json_delta"
            got[-1][1] += data["delta"]["partial_json"]
            pieces += 1
        else:
            assert kind == "content_block_stop" and data["index"] == len(got) - 1
    assert [(name, json.loads(partial)) for name, partial in got] == want
    assert pieces > 2 * len(want)  # the arguments came in pieces
    # The client's helper accumulates the same message from the stream.
    with client.messages.stream(**args) as stream:
        final = stream.get_final_message()
    assert [(u.name, u.input) for u in _uses(final)] == want
    assert final.stop_reason == "tool_use"


def test_streamed_text_and_stop_sequences(client: anthropic.Anthropic) -> None:
    args: dict[str, Any] = dict(model=MODEL, max_tokens=24, messages=ASK)
    free = client.messages.create(**args, extra_body={"temperature": 0, "ignore_eos": True})
    text = free.content[0].text  # type: ignore[union-attr]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip() and stop in text
    for stream in (False, True):
        extra = {"temperature": 0, "ignore_eos": True}
        if stream:
            with client.messages.stream(**args, stop_sequences=[stop], extra_body=extra) as s:
                pieces = list(s.text_stream)
                m = s.get_final_message()
            assert "".join(pieces) == m.content[0].text  # type: ignore[union-attr]
        else:
            m = client.messages.create(**args, stop_sequences=["\x00", stop], extra_body=extra)
        assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
        assert m.content[0].text == text[: text.index(stop)]  # type: ignore[union-attr]


def test_tool_loop_reuses_the_prefix(client: anthropic.Anthropic) -> None:
    """tool_use → tool_result (one of them an error) → ...: each turn after the first is served
    from the radix cache up to where the last one's prompt ended."""
    messages: list[Any] = list(ASK)
    system = "You are an agent. " * 8
    previous, cached = 0, []
    for turn in range(3):
        m = client.messages.create(
            model=MODEL, max_tokens=200, system=system, messages=messages, tools=TOOLS,
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            extra_body={"temperature": 1.0, "seed": turn},
        )  # fmt: skip
        use = _uses(m)[0]
        prompt = m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
        cached.append(m.usage.cache_read_input_tokens or 0)
        if turn:
            assert prompt > previous and cached[-1] >= previous - 32, (cached, previous)
        previous = prompt
        messages.append({"role": "assistant", "content": [b.model_dump() for b in m.content]})
        text = [{"type": "text", "text": json.dumps({"t": turn})}]
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": use.id, "content": text}
        if turn == 1:
            result["is_error"] = True
        messages.append({"role": "user", "content": [result]})
    counted = client.messages.count_tokens(model=MODEL, system=system, messages=messages,
                                           tools=TOOLS)  # fmt: skip
    final = client.messages.create(
        model=MODEL, max_tokens=8, system=system, messages=messages, tools=TOOLS,
        tool_choice={"type": "none"}, **GREEDY,
    )  # fmt: skip
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert all(b.type == "text" for b in final.content)
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == (
        counted.input_tokens
    )
    assert (final.usage.cache_read_input_tokens or 0) >= previous - 32


def test_forced_tool_stream_with_a_named_tool(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model=MODEL, max_tokens=300, messages=ASK, tools=TOOLS,
        tool_choice={"type": "tool", "name": "book_table"}, **GREEDY,
    ) as stream:  # fmt: skip
        final = stream.get_final_message()
    (use,) = _uses(final)
    assert use.name == "book_table"
    jsonschema.validate(use.input, BOOK)


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"max_tokens": None}, "max_tokens"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
      "content": [{"type": "image", "source": {}}]}]}]}, "messages[0].content[0].content[0].type"),
    ({"messages": [*ASK, {"role": "assistant", "content": "Sure"}]}, "messages[1]"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"name": "f", "input_schema": {"type": "array"}}]}, "tools[0].input_schema"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),  # no tools
    ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ({"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, "mcp_servers"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "param"), REFUSED, ids=[p for _, p in REFUSED])
def test_refused_fields_are_400_in_anthropics_shape(
    srv: LiveServer, extra: dict[str, Any], param: str
) -> None:
    body = {"model": MODEL, "max_tokens": 4, "messages": ASK, **extra}
    body = {k: v for k, v in body.items() if v is not None}
    r = httpx.post(srv.url + "/v1/messages", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", err
    assert err["error"]["message"].startswith(param), err  # the field, named first


def test_errors_reach_the_client_typed(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(
            model=MODEL, max_tokens=4,
            messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}],
        )  # fmt: skip
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="claude-nope", max_tokens=4, messages=ASK)
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    m = client.messages.create(model=MODEL, max_tokens=4, messages=ASK)
    assert m.stop_reason in ("end_turn", "max_tokens")


# The Llama 3 JSON call shape, forced by output_config.format: under tool_choice auto (with the
# llama3_json parser) the answer must come back as a tool_use block, streamed or not.
LLAMA3_CALL = {
    "type": "object",
    "properties": {"name": {"const": "book_table"}, "parameters": BOOK},
    "required": ["name", "parameters"],
    "additionalProperties": False,
}


def test_auto_reads_calls_with_the_servers_parser(
    srv: LiveServer, client: anthropic.Anthropic
) -> None:
    output_config: Any = {"format": {"type": "json_schema", "schema": LLAMA3_CALL}}
    args: dict[str, Any] = dict(model=MODEL, max_tokens=300, messages=ASK, tools=TOOLS,
                                output_config=output_config, **GREEDY)  # fmt: skip
    srv.state.tool_call_parser = "llama3_json"  # as --tool-call-parser llama3_json sets it
    try:
        whole = client.messages.create(**args)
        with client.messages.stream(**args) as stream:
            final = stream.get_final_message()
    finally:
        srv.state.tool_call_parser = "hermes"
    assert whole.stop_reason == final.stop_reason == "tool_use"
    (use,) = _uses(whole)
    assert use.name == "book_table"
    assert [(u.name, u.input) for u in _uses(final)] == [(use.name, use.input)]

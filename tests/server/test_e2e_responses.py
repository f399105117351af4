"""OpenAI's Responses API end to end: the official `openai` client against a real server over the
tiny seeded Llama with a Hermes tool template (tool_model.py). Its text is noise, so only the
grammar of `tool_choice` required / named can make its calls valid: every call must validate
against its schema. Also: the same answer as /v1/chat/completions for the same conversation,
the official stream event sequence, a multi-turn function-call loop whose later turns are served
from the radix cache, `store` + `previous_response_id`, and the 400s of refused fields."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import Response
from server_harness import LiveServer, live_server
from tool_model import SCHEMAS, WEATHER, tool_engine, with_tool_template

pytestmark = pytest.mark.slow

MODEL = "tiny-responses"
TOOLS: list[Any] = [
    {"type": "function", "name": n, "description": f"{n} tool", "parameters": p}
    for n, p in SCHEMAS.items()
]
ASK = "What is the weather in Paris, and book a table for two."
GREEDY: dict[str, Any] = {"temperature": 0, "max_output_tokens": 200}


@pytest.fixture(scope="module")
def srv(
    tiny_model_dir: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    path = with_tool_template(tiny_model_dir("llama"), tmp_path_factory.mktemp("resp") / "m")
    with live_server(tool_engine(path), MODEL) as server:
        yield server


@pytest.fixture(scope="module")
def client(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)


def _calls(r: Any) -> list[Any]:
    """The response's function calls, each checked against its tool's schema."""
    calls = [item for item in r.output if item.type == "function_call"]
    for call in calls:
        assert call.call_id.startswith("call_") and call.id.startswith("fc_")
        assert call.status == "completed"
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    return calls


def test_text_answer_is_the_chat_answer(srv: LiveServer, client: openai.OpenAI) -> None:
    """Same template, same engine: the Responses answer is the chat completion's, token for
    token, and the raw body validates against the client's own types."""
    body = {"model": MODEL, "instructions": "Be brief.", "input": ASK, "max_output_tokens": 12,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    raw = httpx.post(srv.url + "/v1/responses", json=body, timeout=60).json()
    r = Response.model_validate(raw)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in r.output] == ["message"] and r.output_text
    chat = client.chat.completions.create(
        model=MODEL, max_tokens=12, temperature=0, extra_body={"ignore_eos": True},
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": ASK}],
    )  # fmt: skip
    assert r.output_text == chat.choices[0].message.content
    assert r.usage is not None and chat.usage is not None
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == 12 and r.usage.total_tokens == r.usage.input_tokens + 12
    # The chat request ran the very same prompt again: all of it but the last page is cached.
    assert chat.usage.prompt_tokens_details is not None
    assert chat.usage.prompt_tokens_details.cached_tokens > 0


@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_calls_validate(client: openai.OpenAI, choice: str) -> None:
    tool_choice: Any = (
        choice if choice == "required" else {"type": "function", "name": "book_table"}
    )
    names = set()
    for seed in range(12):
        r = client.responses.create(
            model=MODEL, input=ASK, tools=TOOLS, tool_choice=tool_choice, temperature=1.0,
            parallel_tool_calls=False, max_output_tokens=200, extra_body={"seed": seed},
        )  # fmt: skip
        assert r.status == "completed"
        calls = _calls(r)
        assert len(calls) == 1 and len(r.output) == 1
        names.add(calls[0].name)
    assert names == ({"book_table"} if choice == "named" else set(SCHEMAS))


def _events(client: openai.OpenAI, **args: Any) -> list[Any]:
    events = list(client.responses.create(model=MODEL, stream=True, **args))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events


def test_streamed_calls_follow_the_official_event_sequence(client: openai.OpenAI) -> None:
    args: dict[str, Any] = dict(input=ASK, tools=TOOLS, tool_choice="required", **GREEDY)
    whole = client.responses.create(model=MODEL, **args)
    events = _events(client, **args)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    final = events[-1].response
    want = [(c.name, c.arguments) for c in _calls(whole)]
    assert [(c.name, c.arguments) for c in _calls(final)] == want
    # Per call: added, argument deltas that concatenate to the arguments, done, item done.
    pos = 2
    for index, (name, arguments) in enumerate(want):
        added = events[pos]
        assert added.type == "response.output_item.added" and added.output_index == index
        assert added.item.type == "function_call" and added.item.name == name
        pieces = []
        pos += 1
        while events[pos].type == "response.function_call_arguments.delta":
            assert events[pos].item_id == added.item.id
            pieces.append(events[pos].delta)
            pos += 1
        assert len(pieces) > 1 and "".join(pieces) == arguments
        assert events[pos].type == "response.function_call_arguments.done"
        assert events[pos].arguments == arguments
        assert events[pos + 1].type == "response.output_item.done"
        assert events[pos + 1].item.arguments == arguments
        pos += 2
    assert pos == len(events) - 1


def test_streamed_text_and_the_stream_helper(client: openai.OpenAI) -> None:
    args: dict[str, Any] = dict(input=ASK, temperature=0, max_output_tokens=16)
    whole = client.responses.create(model=MODEL, **args)
    events = _events(client, **args)
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", *["response.output_text.delta"] * len(deltas),
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        f"response.{whole.status}",
    ]  # fmt: skip
    assert "".join(deltas) == whole.output_text
    assert events[-1].response.output_text == whole.output_text


def test_the_stream_helper_rebuilds_the_response(client: openai.OpenAI) -> None:
    """The client's accumulating helper (it checks indexes and ids as it goes) ends with the
    response that the non-streamed request answers."""
    args: dict[str, Any] = dict(input=ASK, tools=TOOLS, tool_choice="required", **GREEDY)
    whole = client.responses.create(model=MODEL, **args)
    with client.responses.stream(model=MODEL, **args) as stream:
        final = stream.get_final_response()
    got = [(c.type, c.name, c.arguments) for c in final.output]  # type: ignore[union-attr]
    assert got == [(c.type, c.name, c.arguments) for c in _calls(whole)]


def test_function_call_loop_reuses_the_prefix(client: openai.OpenAI) -> None:
    """An agent loop that sends each call's output back: every turn after the first is served
    from the radix cache up to where the last one's prompt ended."""
    items: list[Any] = [{"role": "user", "content": ASK}]
    previous_input, cached = 0, []
    for turn in range(3):
        r = client.responses.create(
            model=MODEL, instructions="You are an agent.", input=items, tools=TOOLS,
            tool_choice="required", parallel_tool_calls=False, temperature=1.0,
            max_output_tokens=200, extra_body={"seed": turn},
        )  # fmt: skip
        call = _calls(r)[0]
        assert r.usage is not None
        cached.append(r.usage.input_tokens_details.cached_tokens)
        if turn:
            assert r.usage.input_tokens > previous_input
            assert cached[-1] >= previous_input - 32, (cached, previous_input)
        previous_input = r.usage.input_tokens
        items += [item.model_dump(exclude_none=True) for item in r.output]
        output = json.dumps({"ok": True, "turn": turn})
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": output})
    final = client.responses.create(
        model=MODEL, instructions="You are an agent.", input=items, tools=TOOLS, tool_choice="none",
        temperature=0, max_output_tokens=8,
    )  # fmt: skip
    assert [item.type for item in final.output] == ["message"]
    assert final.usage is not None and final.usage.input_tokens_details.cached_tokens > 0


def test_previous_response_id_continues_a_stored_conversation(
    srv: LiveServer, client: openai.OpenAI
) -> None:
    first = client.responses.create(
        model=MODEL, input=ASK, tools=TOOLS, tool_choice="required", store=True,
        parallel_tool_calls=False, **GREEDY,
    )  # fmt: skip
    assert first.store
    call = _calls(first)[0]
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, input=[result], tools=TOOLS,
        tool_choice={"type": "function", "name": "get_weather"}, store=True, **GREEDY,
    )  # fmt: skip
    assert second.previous_response_id == first.id
    jsonschema.validate(json.loads(_calls(second)[0].arguments), WEATHER)
    # The same conversation sent whole, statelessly, is the same prompt.
    items = [{"role": "user", "content": ASK}, *[i.model_dump(exclude_none=True)
             for i in first.output], result]  # fmt: skip
    whole = client.responses.create(
        model=MODEL, input=items, tools=TOOLS,
        tool_choice={"type": "function", "name": "get_weather"}, **GREEDY,
    )  # fmt: skip
    assert second.usage is not None and whole.usage is not None and first.usage is not None
    assert whole.usage.input_tokens == second.usage.input_tokens > first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0
    assert whole.output[0].arguments == second.output[0].arguments  # type: ignore[union-attr]
    # Stored responses can be read back and deleted; unstored ones were never kept.
    assert client.responses.retrieve(first.id).output[0].id == first.output[0].id
    client.responses.delete(first.id)
    for rid in (first.id, whole.id):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(rid)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, previous_response_id=first.id, input="and now?")
    assert httpx.get(srv.url + f"/v1/responses/{second.id}").status_code == 200


def test_text_format_json_schema_holds_the_output(client: openai.OpenAI) -> None:
    fmt: Any = {"type": "json_schema", "name": "weather", "schema": WEATHER, "strict": True}
    r = client.responses.create(model=MODEL, input=ASK, text={"format": fmt}, **GREEDY)
    jsonschema.validate(json.loads(r.output_text), WEATHER)
    assert r.text is not None and r.text.format.type == "json_schema"


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools[0].type"),
    ({"background": True}, "background"),
    ({"include": ["reasoning.encrypted_content"]}, "include"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"truncation": "auto"}, "truncation"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"max_tool_calls": 2}, "max_tool_calls"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),  # no tools
    ({"text": {"format": {"type": "grammar"}}}, "text.format.type"),
    ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "input[0].type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "array"}}]},
     "tools[0].parameters"),
    ({"tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "param"), REFUSED, ids=[p for _, p in REFUSED])
def test_refused_fields_are_400_naming_them(
    srv: LiveServer, extra: dict[str, Any], param: str
) -> None:
    body = {"model": MODEL, "input": ASK, "max_output_tokens": 4, **extra}
    r = httpx.post(srv.url + "/v1/responses", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_refusals_reach_the_client_and_the_server_keeps_serving(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input=ASK, tools=[{"type": "web_search"}])
    assert "function tools only" in str(info.value)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="another-model", input=ASK)
    r = client.responses.create(model=MODEL, input=ASK, max_output_tokens=4)
    assert r.status in ("completed", "incomplete")


# The Llama 3 JSON call shape, forced by text.format: under `auto` (with the llama3_json parser)
# the answer must come back as a function_call item, streamed or not.
LLAMA3_CALL = {
    "type": "object",
    "properties": {"name": {"const": "get_weather"}, "parameters": WEATHER},
    "required": ["name", "parameters"],
    "additionalProperties": False,
}


def test_auto_reads_calls_with_the_servers_parser(srv: LiveServer, client: openai.OpenAI) -> None:
    fmt: Any = {"type": "json_schema", "name": "call", "schema": LLAMA3_CALL}
    args: dict[str, Any] = dict(model=MODEL, input=ASK, tools=TOOLS, text={"format": fmt},
                                **GREEDY)  # fmt: skip
    srv.state.tool_call_parser = "llama3_json"  # as --tool-call-parser llama3_json sets it
    try:
        whole = client.responses.create(**args)
        events = list(client.responses.create(**args, stream=True))
    finally:
        srv.state.tool_call_parser = "hermes"
    (call,) = _calls(whole)
    assert call.name == "get_weather" and [o.type for o in whole.output] == ["function_call"]
    final = events[-1].response
    assert [(c.name, c.arguments) for c in _calls(final)] == [(call.name, call.arguments)]
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert "".join(deltas) == call.arguments

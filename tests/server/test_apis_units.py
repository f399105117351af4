"""The agent APIs' translations, without a server: Responses input items and Anthropic messages
into chat messages, chat chunk deltas into output item events, the bounded response store, and
Anthropic's error shape."""

from __future__ import annotations

import json
from typing import Any

import pytest

from radixkv.server.apis import messages_protocol, responses_protocol
from radixkv.server.apis.bridge import ItemTracker, arguments_object, items_of
from radixkv.server.apis.response_store import ResponseStore
from radixkv.server.errors import APIError, anthropic_body


def test_responses_items_become_chat_turns() -> None:
    items: list[dict[str, Any]] = [
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "two"}]},
    ]  # fmt: skip
    out = responses_protocol.chat_messages("Be brief.", items)
    assert out[0] == {"role": "system", "content": "Be brief.\n\nUse tools."}
    assert out[1] == {"role": "user", "content": "Hi"}
    assert out[2]["content"] == "Let me look."
    assert [c["function"]["name"] for c in out[2]["tool_calls"]] == ["f", "g"]
    assert out[3:] == [
        {"role": "tool", "tool_call_id": "c1", "content": "one", "name": "f"},
        {"role": "tool", "tool_call_id": "c2", "content": "two", "name": "g"},
    ]
    # A call with no assistant text before it starts its own assistant turn.
    calls = responses_protocol.chat_messages(None, [items[1], items[3]])
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    assert calls[1] == {"role": "assistant", "content": "", "tool_calls": [call]}


def test_responses_request_translates_tools_choice_and_format() -> None:
    req = responses_protocol.ResponsesRequest.model_validate(
        {"input": "q", "max_output_tokens": 7, "parallel_tool_calls": False,
         "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
         "tool_choice": {"type": "function", "name": "f"},
         "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}}}
    )  # fmt: skip
    chat = req.chat([{"role": "user", "content": "before"}])
    assert [m.role for m in chat.messages] == ["user", "user"]
    assert chat.max_tokens == 7 and chat.parallel_tool_calls is False
    assert chat.tools is not None and chat.tools[0].function.name == "f"
    assert chat.tool_choice == {"type": "function", "function": {"name": "f"}}
    schema = {"name": "s", "schema": {"type": "object"}}
    assert chat.response_format == {"type": "json_schema", "json_schema": schema}


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"role": "tool", "content": "x"}, "input[0].role"),
        ({"role": "user", "content": [{"type": "input_file", "file_id": "f"}]},
         "input[0].content[0].type"),
        ({"type": "function_call", "name": "f"}, "input[0].call_id"),
        ({"type": "computer_call", "id": "c"}, "input[0].type"),
    ],
)  # fmt: skip
def test_responses_bad_items_name_their_field(item: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as info:
        responses_protocol.chat_messages(None, [item])
    assert info.value.param == param and info.value.status == 400


def test_anthropic_blocks_become_chat_turns() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
             "content": [{"type": "text", "text": "timeout"}]},
            {"type": "text", "text": "Try again."}]},
    ]  # fmt: skip
    system = [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]
    out = messages_protocol.chat_messages(system, messages)
    assert out[0] == {"role": "system", "content": "A\nB"}
    assert out[2]["content"] == "Checking."
    assert out[2]["tool_calls"][0]["function"] == {"name": "w", "arguments": '{"city": "Paris"}'}
    assert out[3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: timeout"}
    assert out[4] == {"role": "user", "content": "Try again."}


def test_anthropic_tool_choice_maps_to_openais() -> None:
    base = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}]}  # fmt: skip
    for choice, want, parallel in [
        ({"type": "auto"}, "auto", True),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
        ({"type": "none"}, "none", True),
        ({"type": "tool", "name": "f"}, {"type": "function", "function": {"name": "f"}}, True),
    ]:
        req = messages_protocol.MessagesRequest.model_validate({**base, "tool_choice": choice})
        chat = req.chat()
        assert chat.tool_choice == want and chat.parallel_tool_calls is parallel


def _delta(content: str | None = None, **call: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if content is not None:
        out["content"] = content
    if call:
        fn = {k: call[k] for k in ("name", "arguments") if k in call}
        out["tool_calls"] = [{"index": call["index"], "id": call.get("id"), "function": fn}]
    return out


def test_item_tracker_opens_grows_and_closes_items_in_order() -> None:
    t = ItemTracker()
    seen = []
    for d in [
        {"role": "assistant", "content": ""},
        _delta("Let "),
        _delta("me."),
        _delta(index=0, id="call_a", name="f", arguments='{"x": '),
        _delta(index=0, arguments="1}"),
        _delta(index=1, id="call_b", name="g", arguments="{}"),
        _delta(index=0, arguments="late"),  # after the next item began: dropped
    ]:
        seen += [(what, item.position, piece) for what, item, piece in t.feed(d)]
    seen += [(what, item.position, piece) for what, item, piece in t.finish()]
    assert seen == [
        ("open", 0, ""), ("delta", 0, "Let "), ("delta", 0, "me."), ("close", 0, ""),
        ("open", 1, ""), ("delta", 1, '{"x": '), ("delta", 1, "1}"), ("close", 1, ""),
        ("open", 2, ""), ("delta", 2, "{}"), ("close", 2, ""),
    ]  # fmt: skip
    assert [(i.kind, i.text, i.name) for i in t.items] == [
        ("text", "Let me.", ""), ("call", '{"x": 1}', "f"), ("call", "{}", "g")]  # fmt: skip
    empty = ItemTracker()
    assert [(w, i.kind) for w, i, _ in empty.finish(placeholder=True)] == [
        ("open", "text"), ("close", "text")]  # fmt: skip
    message = {"content": None, "tool_calls": [
        {"id": "call_c", "function": {"name": "f", "arguments": "{}"}}]}  # fmt: skip
    assert [(i.kind, i.call_id) for i in items_of(message)] == [("call", "call_c")]
    assert [i.kind for i in items_of({"content": ""}, placeholder=True)] == ["text"]


def test_response_store_is_bounded_least_recently_used_first() -> None:
    store = ResponseStore(max_responses=3, max_chars=10**6)
    for i in range(3):
        store.put({"id": f"r{i}"}, [], [{"n": i}])
    assert store.get("r0") is not None  # r0 is now the most recently used
    store.put({"id": "r3"}, store.get("r2").conversation, [{"n": 3}])  # type: ignore[union-attr]
    assert store.get("r1") is None and len(store) == 3
    assert [item["n"] for item in store.get("r3").conversation] == [2, 3]  # type: ignore[union-attr]
    assert store.delete("r3") and not store.delete("r3")
    small = ResponseStore(max_responses=100, max_chars=200)
    for i in range(10):
        small.put({"id": f"s{i}"}, [], [{"text": "x" * 40}])
    kept = [i for i in range(10) if small.get(f"s{i}") is not None]
    assert kept == list(range(10 - len(kept), 10)) and 1 <= len(kept) <= 3
    chars = sum(len(json.dumps([{"text": "x" * 40}])) + len(json.dumps({"id": "s0"})) for _ in kept)
    assert chars <= 200


def test_anthropic_error_shape() -> None:
    body = anthropic_body(APIError("must be a string", param="messages[0].content"))
    assert body == {"type": "error", "error": {"type": "invalid_request_error",
                    "message": "messages[0].content: must be a string"}}  # fmt: skip
    assert anthropic_body(APIError("x", 503))["error"]["type"] == "overloaded_error"
    assert anthropic_body(APIError("x", 500))["error"]["type"] == "api_error"
    assert anthropic_body(APIError("x", 401))["error"]["type"] == "authentication_error"


def test_arguments_object_of_a_cut_call_is_empty() -> None:
    assert arguments_object('{"a": [1, 2]}') == {"a": [1, 2]}
    assert arguments_object('{"a": [1, ') == {} and arguments_object("") == {}

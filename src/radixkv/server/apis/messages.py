"""Anthropic's Messages API: `POST /v1/messages` (JSON, or SSE with Anthropic's event sequence)
and `POST /v1/messages/count_tokens`.

A request runs as a chat completion (bridge.py); its answer becomes content blocks, a `text`
block then one `tool_use` block per call. Streamed:

    message_start, ping,
    per block: content_block_start, content_block_delta... (text_delta / input_json_delta),
               content_block_stop
    message_delta (stop_reason, stop_sequence, usage), message_stop
    (an engine failure mid-stream: an `error` event instead of the end).

`stop_reason`: `tool_use` when the model called a tool and stopped, `max_tokens`, `stop_sequence`
(with the sequence that matched), else `end_turn`. Usage follows Anthropic's split: `input_tokens`
are the prompt tokens computed for this request, `cache_read_input_tokens` those the radix cache
served (their sum is the prompt), `cache_creation_input_tokens` is 0. Errors answer in
Anthropic's shape (middleware.py), and `x-api-key` is accepted as the API key."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from radixkv.server.apis.bridge import (
    Item,
    ItemEvent,
    ItemTracker,
    arguments_object,
    count_prompt,
    items_of,
    renamed,
    start_chat,
)
from radixkv.server.apis.messages_protocol import MESSAGES_NAMES, MessagesRequest
from radixkv.server.errors import APIError, anthropic_body
from radixkv.server.openai.generate import event_stream
from radixkv.server.openai.prompts import read_body
from radixkv.server.openai.protocol import parse_body
from radixkv.server.openai.serving import Generation

if TYPE_CHECKING:
    from radixkv.server.app import ServerState


def tool_use_id(call_id: str) -> str:
    """Anthropic-style ids for the chat path's call ids (`call_X` → `toolu_X`)."""
    return "toolu_" + call_id.removeprefix("call_")


def block(item: Item, final: bool = True) -> dict[str, Any]:
    """An item as a content block (`final=False`: as content_block_start shows it, empty)."""
    if item.kind == "text":
        return {"type": "text", "text": item.text if final else ""}
    call_input = arguments_object(item.text) if final else {}
    return {
        "type": "tool_use",
        "id": tool_use_id(item.call_id),
        "name": item.name,
        "input": call_input,
    }


def usage(gen: Generation) -> dict[str, Any]:
    return {
        "input_tokens": gen.prompt_tokens - gen.cached_tokens,
        "output_tokens": gen.completion_tokens,
        "cache_read_input_tokens": gen.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def stop_of(
    state: ServerState, gen: Generation, finish_reason: str | None, stops: list[str] | None
) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of the answer."""
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    choice = gen.choices[0]
    if stops and choice.token_ids:
        # The engine cuts the text before the stop string; the tokens still hold it.
        text = "".join(choice.parts)
        full = state.tokenizer.decode(choice.token_ids)
        rest = full[len(text) :] if full.startswith(text) else ""
        for s in stops:
            if s and rest.startswith(s):
                return "stop_sequence", s
    return "end_turn", None


async def _parse(state: ServerState, request: Request) -> MessagesRequest:
    req = parse_body(MessagesRequest, await read_body(request))
    state.check_model(req.model)
    req.refuse_unsupported()
    return req


async def create_message(state: ServerState, request: Request) -> Response:
    """POST /v1/messages."""
    req = await _parse(state, request)
    if req.max_tokens is None or req.max_tokens < 1:
        raise APIError("max_tokens is required (an integer >= 1)", param="max_tokens")
    message_id = f"msg_{uuid.uuid4().hex}"
    with renamed(MESSAGES_NAMES):
        gen = await start_chat(state, req.chat(), message_id, "messages")
    head = {"id": message_id, "type": "message", "role": "assistant", "model": state.model_name}
    if req.stream:
        return event_stream(_events(state, req, head, gen), gen)
    choice = (await gen.collect(request))["choices"][0]
    reason, sequence = stop_of(state, gen, choice["finish_reason"], req.stop_sequences)
    content = [block(i) for i in items_of(choice["message"])]
    return JSONResponse(
        {
            **head,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage(gen),
        }
    )


def _sse(kind: str, body: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **body}, ensure_ascii=False)}\n\n"


async def _events(
    state: ServerState, req: MessagesRequest, head: dict[str, Any], gen: Generation
) -> AsyncIterator[str]:
    """The SSE events of a streamed message; the request is released however it ends."""
    tracker, finish, started = ItemTracker(), None, False

    def start() -> str:
        message = {
            **head,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**usage(gen), "output_tokens": 0},
        }
        return _sse("message_start", {"message": message}) + _sse("ping", {})

    try:
        try:
            async for chunk in gen.chunks():
                for choice in chunk["choices"]:
                    if choice["delta"].get("role"):
                        continue  # the chat stream's first chunk: nothing run yet
                    if not started:
                        started = True
                        yield start()  # after the first step: usage knows the cache hit
                    finish = choice["finish_reason"] or finish
                    for event in tracker.feed(choice["delta"]):
                        yield _wire(event)
        except APIError as err:
            yield _sse("error", {"error": anthropic_body(err)["error"]})
            return
        if not started:
            yield start()
        for event in tracker.finish():
            yield _wire(event)
        reason, sequence = stop_of(state, gen, finish, req.stop_sequences)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        yield _sse("message_delta", {"delta": delta, "usage": usage(gen)})
        yield _sse("message_stop", {})
    finally:
        gen.finish()


def _wire(event: ItemEvent) -> str:
    """One item event as an Anthropic stream event."""
    what, item, piece = event
    if what == "open":
        return _sse(
            "content_block_start",
            {"index": item.position, "content_block": block(item, final=False)},
        )
    if what == "close":
        return _sse("content_block_stop", {"index": item.position})
    delta = (
        {"type": "text_delta", "text": piece}
        if item.kind == "text"
        else {"type": "input_json_delta", "partial_json": piece}
    )
    return _sse("content_block_delta", {"index": item.position, "delta": delta})


def install_messages_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await create_message(state, request)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> dict[str, int]:
        req = await _parse(state, request)
        with renamed(MESSAGES_NAMES):
            return {"input_tokens": await count_prompt(state, req.chat(), "messages")}

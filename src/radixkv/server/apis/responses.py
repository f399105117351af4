"""OpenAI's Responses API: `POST /v1/responses` (JSON, or SSE with the official event
sequence), `GET /v1/responses/{id}` and `DELETE /v1/responses/{id}` for stored responses.

A request runs as a chat completion (bridge.py) and its answer becomes output items: a `message`
item with one `output_text` part, then one `function_call` item per call. Streamed, that is:

    response.created, response.in_progress,
    per item: response.output_item.added,
      message:  response.content_part.added, response.output_text.delta..., .output_text.done,
                response.content_part.done
      call:     response.function_call_arguments.delta..., .function_call_arguments.done
    response.output_item.done; then response.completed (or response.incomplete when
    max_output_tokens cut it, response.failed when the engine failed it).

Stateless unless `store: true`: then the response and its conversation are kept (bounded, see
response_store.py) for `previous_response_id`, which continues that conversation (its
`instructions` are not carried over, as OpenAI does)."""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from radixkv.server.apis.bridge import Item, ItemEvent, ItemTracker, items_of, renamed, start_chat
from radixkv.server.apis.response_store import ResponseStore
from radixkv.server.apis.responses_protocol import RESPONSES_NAMES, ResponsesRequest
from radixkv.server.errors import APIError
from radixkv.server.openai.generate import event_stream
from radixkv.server.openai.prompts import read_body
from radixkv.server.openai.protocol import parse_body
from radixkv.server.openai.serving import Generation

if TYPE_CHECKING:
    from radixkv.server.app import ServerState


class ResponseBuilder:
    """The response object of one request, as it stands at each step (ids stay the same)."""

    def __init__(self, state: ServerState, req: ResponsesRequest, response_id: str) -> None:
        self.state = state
        self.req = req
        self.id = response_id
        self.created = int(time.time())
        self._item_ids: dict[int, str] = {}

    def item_id(self, item: Item) -> str:
        prefix = "msg" if item.kind == "text" else "fc"
        return self._item_ids.setdefault(item.position, f"{prefix}_{uuid.uuid4().hex}")

    def item(self, item: Item, status: str) -> dict[str, Any]:
        if item.kind == "text":
            content = [] if status == "in_progress" else [text_part(item.text)]
            return {
                "id": self.item_id(item),
                "type": "message",
                "role": "assistant",
                "status": status,
                "content": content,
            }
        return {
            "id": self.item_id(item),
            "type": "function_call",
            "call_id": item.call_id,
            "name": item.name,
            "arguments": item.text,
            "status": status,
        }

    def object(
        self,
        status: str,
        output: list[dict[str, Any]],
        gen: Generation | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        req = self.req
        usage = None
        if gen is not None:
            usage = {
                "input_tokens": gen.prompt_tokens,
                "input_tokens_details": {
                    "cached_tokens": gen.cached_tokens,
                    "cache_write_tokens": 0,
                },
                "output_tokens": gen.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": gen.prompt_tokens + gen.completion_tokens,
            }
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "completed_at": int(time.time()) if status == "completed" else None,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": None,
            "metadata": req.metadata or {},
            "model": self.state.model_name,
            "output": output,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": None,
            "store": bool(req.store),
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "tools": req.tools or [],
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
        }


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _status(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


async def create_response(state: ServerState, store: ResponseStore, request: Request) -> Response:
    """POST /v1/responses."""
    req = parse_body(ResponsesRequest, await read_body(request))
    state.check_model(req.model)
    req.refuse_unsupported()
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        entry = store.get(req.previous_response_id)
        if entry is None:
            raise APIError(
                f"previous response {req.previous_response_id!r} not found (only responses "
                "created with store: true are kept, and a bounded number of them)",
                404,
                param="previous_response_id",
                code="previous_response_not_found",
            )
        history = entry.conversation
    builder = ResponseBuilder(state, req, f"resp_{uuid.uuid4().hex}")
    with renamed(RESPONSES_NAMES):
        chat = req.chat(history)
        gen = await start_chat(state, chat, builder.id, "input")
    if req.stream:
        return event_stream(_events(builder, gen, store, history), gen)
    with renamed(RESPONSES_NAMES):
        choice = (await gen.collect(request))["choices"][0]
    status = _status(choice["finish_reason"])
    output = [builder.item(i, status) for i in items_of(choice["message"], placeholder=True)]
    final = builder.object(status, output, gen)
    if req.store:
        store.put(final, history, [*req.input_items(), *output])
    return JSONResponse(final)


async def _events(
    builder: ResponseBuilder, gen: Generation, store: ResponseStore, history: list[dict[str, Any]]
) -> AsyncIterator[str]:
    """The SSE events of a streamed response; the request is released however it ends."""
    numbers = itertools.count()

    def sse(kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": next(numbers), **fields}
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

    tracker, finish = ItemTracker(), None
    try:
        yield sse("response.created", response=builder.object("in_progress", []))
        yield sse("response.in_progress", response=builder.object("in_progress", []))
        try:
            async for chunk in gen.chunks():
                for choice in chunk["choices"]:
                    finish = choice["finish_reason"] or finish
                    for event in tracker.feed(choice["delta"]):
                        for kind, fields in _wire(builder, event, "completed"):
                            yield sse(kind, **fields)
        except APIError as err:
            output = [builder.item(i, "incomplete") for i in tracker.items]
            error = {"code": err.code or "server_error", "message": err.message}
            yield sse("response.failed", response=builder.object("failed", output, gen, error))
            return
        status = _status(finish)
        for event in tracker.finish(placeholder=True):
            for kind, fields in _wire(builder, event, status):
                yield sse(kind, **fields)
        output = [builder.item(i, status) for i in tracker.items]
        final = builder.object(status, output, gen)
        if builder.req.store:
            store.put(final, history, [*builder.req.input_items(), *output])
        yield sse(f"response.{status}", response=final)
    finally:
        gen.finish()


def _wire(builder: ResponseBuilder, event: ItemEvent, status: str) -> list[tuple[str, Any]]:
    """One item event as Responses stream events: (type, fields) pairs."""
    what, item, piece = event
    where = {"item_id": builder.item_id(item), "output_index": item.position}
    if item.kind == "text":
        at = {**where, "content_index": 0}
        if what == "open":
            added = builder.item(item, "in_progress")
            return [
                ("response.output_item.added", {"output_index": item.position, "item": added}),
                ("response.content_part.added", {**at, "part": text_part("")}),
            ]
        if what == "delta":
            return [("response.output_text.delta", {**at, "delta": piece, "logprobs": []})]
        return [
            ("response.output_text.done", {**at, "text": item.text, "logprobs": []}),
            ("response.content_part.done", {**at, "part": text_part(item.text)}),
            (
                "response.output_item.done",
                {"output_index": item.position, "item": builder.item(item, status)},
            ),
        ]
    if what == "open":
        added = builder.item(item, "in_progress")
        return [("response.output_item.added", {"output_index": item.position, "item": added})]
    if what == "delta":
        return [("response.function_call_arguments.delta", {**where, "delta": piece})]
    done = {**where, "arguments": item.text, "name": item.name}
    return [
        ("response.function_call_arguments.done", done),
        (
            "response.output_item.done",
            {"output_index": item.position, "item": builder.item(item, "completed")},
        ),
    ]


def install_responses_routes(app: FastAPI, state: ServerState) -> ResponseStore:
    """The Responses API routes; returns the store they share."""
    store = ResponseStore()

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await create_response(state, store, request)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str) -> dict[str, Any]:
        entry = store.get(response_id)
        if entry is None:
            raise _not_found(response_id)
        return entry.response

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str) -> dict[str, Any]:
        if not store.delete(response_id):
            raise _not_found(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    return store


def _not_found(response_id: str) -> APIError:
    return APIError(
        f"response {response_id!r} not found (only responses created with store: true are kept)",
        404,
        param="response_id",
        code="not_found",
    )

"""What the agent APIs share: each one translates its request into a chat completion request and
runs it on the chat path (template rendering with tools, tool_choice grammars, tool-call
parsing, streamed tool-call deltas), then translates the answer back.

The answer of a chat generation, seen as the agent APIs show it, is a list of output items: a
text item (the content), then one item per tool call. `ItemTracker` turns the chat chunk deltas
of a stream into item events, in an order both APIs' streams require: an item is opened, grows,
and is closed before the next one opens (content always precedes the calls: the parsers keep only
the text before the first call)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from radixkv.engine.types import RequestError
from radixkv.server.errors import APIError
from radixkv.server.middleware import request_error
from radixkv.server.openai.generate import start_generation
from radixkv.server.openai.prompts import chat_prompt
from radixkv.server.openai.protocol import ChatCompletionRequest
from radixkv.server.openai.serving import Generation

if TYPE_CHECKING:
    from radixkv.server.app import ServerState

log = logging.getLogger("radixkv.server")


@dataclass
class Item:
    """One output item: the text, or one tool call (`text` then holds its arguments JSON)."""

    position: int
    kind: Literal["text", "call"]
    text: str = ""
    call_id: str = ""
    name: str = ""


ItemEvent = tuple[Literal["open", "delta", "close"], Item, str]


class ItemTracker:
    """Chat chunk deltas → item events: ("open", item, ""), ("delta", item, piece), ("close",
    item, ""). The deltas of a call's arguments concatenate to its final arguments JSON (the
    contract of tool_stream.ToolCallStream)."""

    def __init__(self) -> None:
        self.items: list[Item] = []
        self._open: Item | None = None
        self._calls: dict[int, Item] = {}

    def _start(self, kind: Literal["text", "call"], **fields: str) -> list[ItemEvent]:
        events = self.close()
        self._open = Item(len(self.items), kind, **fields)
        self.items.append(self._open)
        return [*events, ("open", self._open, "")]

    def feed(self, delta: dict[str, Any]) -> list[ItemEvent]:
        events: list[ItemEvent] = []
        content = delta.get("content")
        if content:
            if self._open is None or self._open.kind != "text":
                events += self._start("text")
            assert self._open is not None
            self._open.text += content
            events.append(("delta", self._open, content))
        for call in delta.get("tool_calls") or []:
            fn = call.get("function") or {}
            if call["index"] not in self._calls:
                events += self._start("call", call_id=call["id"], name=fn["name"])
                assert self._open is not None
                self._calls[call["index"]] = self._open
            item, piece = self._calls[call["index"]], fn.get("arguments") or ""
            if piece and item is not self._open:
                log.warning("tool call %d: arguments after the next item began", call["index"])
            elif piece:
                item.text += piece
                events.append(("delta", item, piece))
        return events

    def finish(self, placeholder: bool = False) -> list[ItemEvent]:
        """Close the last item at the end of the answer; with `placeholder`, an answer with no
        item at all gets an empty text item (the Responses API always answers a message)."""
        events = self.close()
        if placeholder and not self.items:
            events += [*self._start("text"), *self.close()]
        return events

    def close(self) -> list[ItemEvent]:
        """Close the open item, if any (at the next item, and at the end of the answer)."""
        if self._open is None:
            return []
        item, self._open = self._open, None
        return [("close", item, "")]


def items_of(message: dict[str, Any], placeholder: bool = False) -> list[Item]:
    """The items of a whole chat answer (its assistant message); `placeholder` as in
    `ItemTracker.finish`."""
    items = [Item(0, "text", message["content"])] if message.get("content") else []
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        items.append(Item(len(items), "call", fn["arguments"], call["id"], fn["name"]))
    return items or ([Item(0, "text")] if placeholder else [])


def arguments_object(arguments: str) -> dict[str, Any]:
    """A call's arguments JSON as an object (the parsers only return objects; a call cut short
    by the token limit, whose arguments never closed, has none)."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@contextmanager
def renamed(names: dict[str, str]) -> Iterator[None]:
    """Errors raised inside name the chat path's fields (`tools[0].function.parameters`);
    rewrite them to this API's names (`tools[0].input_schema`), longest names first."""
    try:
        yield
    except (APIError, RequestError) as exc:
        err = exc if isinstance(exc, APIError) else request_error(exc)
        for old, new in sorted(names.items(), key=lambda kv: -len(kv[0])):
            err.message = err.message.replace(old, new)
            if err.param is not None:
                err.param = err.param.replace(old, new)
        err.args = (err.message,)
        raise err from None


def chat_request(body: dict[str, Any]) -> ChatCompletionRequest:
    """The chat completion request an API request translates into (its fields already checked
    by that API's own parser, so a failure here is named by the chat field)."""
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise APIError(f"invalid request: {loc}: {first['msg']}", param=loc) from None


async def start_chat(
    state: ServerState, chat: ChatCompletionRequest, request_id: str, prompt_param: str
) -> Generation:
    """Check and render `chat`, and submit it; errors name chat fields (see `renamed`)."""
    chat.check(state.vocab_size)
    ids, plan = await chat_prompt(state, chat, prompt_param)
    return await start_generation(state, "chat", chat, ids, request_id, plan, prompt_param)


async def count_prompt(state: ServerState, chat: ChatCompletionRequest, param: str) -> int:
    """The prompt tokens `chat` would run with (nothing is run)."""
    chat.check(state.vocab_size)
    ids, _ = await chat_prompt(state, chat, param)
    return len(ids)

"""Anthropic's Messages API request (`POST /v1/messages`, `/v1/messages/count_tokens`), checked
and translated into a chat completion request.

Taken: `model`, `max_tokens` (required), `system` (a string or text blocks), `messages` (role user
/ assistant; content a string or blocks: `text`, `tool_use` in assistant turns, `tool_result` in
user turns with `content` a string or text blocks and `is_error`), `tools` ({name, description,
input_schema}), `tool_choice` ({type: auto | any | tool | none, name, disable_parallel_tool_use}),
`stop_sequences`, `temperature`, `top_p`, `top_k` (newer clients send these three through
`extra_body`), `output_config.format` (or the older `output_format`: a JSON schema the output is
held to), `stream`, and RadixKV's extensions (`cache_salt`, `session_id`, `priority`, `seed`,
`ignore_eos`). Ignored as hints: `metadata`, `service_tier`, `output_config.effort`, `speed`,
`inference_geo`, and `cache_control` marks (the radix cache reuses every shared prefix by
itself). Refused with a 400 naming the field: image / document / thinking / server-tool blocks,
server tools (`bash_*`, `web_search_*`, `text_editor_*`, ...), `thinking` unless disabled,
`mcp_servers`, `container`, and a last message from the assistant (prefill)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from radixkv.server.apis.bridge import chat_request
from radixkv.server.errors import APIError
from radixkv.server.openai.protocol import ChatCompletionRequest

# The chat path's field names → this API's, for errors raised on the chat path.
MESSAGES_NAMES = {
    ".function.parameters": ".input_schema",
    ".function.name": ".name",
    "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
    "response_format": "output_config.format",
}
# Anthropic's tool_choice types → OpenAI's.
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = None  # required by /v1/messages (checked there), not count_tokens
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool | None = None
    metadata: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    output_format: dict[str, Any] | None = None
    # Refused when set (checked in `refuse_unsupported`).
    thinking: dict[str, Any] | None = None
    mcp_servers: list[Any] | None = None
    container: Any = None
    # RadixKV extensions.
    cache_salt: str | None = Field(default=None, max_length=256)
    session_id: str | None = Field(default=None, min_length=1, max_length=256)
    priority: int = 0
    seed: int | None = None
    ignore_eos: bool = False

    def refuse_unsupported(self) -> None:
        refused = {
            "thinking": (self.thinking or {}).get("type", "disabled") != "disabled",
            "mcp_servers": bool(self.mcp_servers),
            "container": self.container is not None,
        }
        for field, bad in refused.items():
            if bad:
                raise APIError(
                    f"{field} is not supported by this server's Messages API", param=field
                )

    def chat(self) -> ChatCompletionRequest:
        """The chat completion request this runs as."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": chat_messages(self.system, self.messages),
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "stop": self.stop_sequences,
            "response_format": self.response_format(),
            "cache_salt": self.cache_salt,
            "session_id": self.session_id,
            "priority": self.priority,
            "seed": self.seed,
            "ignore_eos": self.ignore_eos,
        }
        if self.tools:
            body["tools"] = [_chat_tool(i, t) for i, t in enumerate(self.tools)]
        if self.tool_choice is not None:
            body["tool_choice"], parallel = _chat_tool_choice(self.tool_choice)
            body["parallel_tool_calls"] = parallel
        return chat_request(body)

    def response_format(self) -> dict[str, Any] | None:
        """`output_config.format` (or `output_format`) as the chat path's response_format."""
        fmt = (self.output_config or {}).get("format") or self.output_format
        if fmt is None:
            return None
        if fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise _bad(
                "output_config.format",
                'the output format is {"type": "json_schema", "schema": {...}}',
            )
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def chat_messages(
    system: str | list[dict[str, Any]] | None, messages: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Anthropic messages → chat messages: a `system` message first; an assistant turn's text and
    `tool_use` blocks are one assistant message with `tool_calls`; a user turn's `tool_result`
    blocks are `tool` messages (in order, its text blocks a user message after them)."""
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": _text(system, "system")})
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant"):
            raise _bad(f"{where}.role", f"role {role!r} is not user or assistant")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif not isinstance(content, list):
            raise _bad(f"{where}.content", "content must be a string or a list of blocks")
        elif role == "assistant":
            out.append(_assistant(content, f"{where}.content"))
        else:
            out.extend(_user(content, f"{where}.content"))
    if messages[-1].get("role") == "assistant":
        raise _bad(
            f"messages[{len(messages) - 1}]",
            "a last assistant message (a prefill to continue) is not supported",
        )
    return out


def _assistant(blocks: list[Any], where: str) -> dict[str, Any]:
    texts, calls = [], []
    for j, block in enumerate(blocks):
        kind = _kind(block, f"{where}[{j}]")
        if kind == "text":
            texts.append(_str(block, "text", f"{where}[{j}]"))
        elif kind == "tool_use":
            call_input = block.get("input", {})
            if not isinstance(call_input, dict):
                raise _bad(f"{where}[{j}].input", "tool_use input must be an object")
            calls.append(
                {
                    "id": _str(block, "id", f"{where}[{j}]"),
                    "type": "function",
                    "function": {
                        "name": _str(block, "name", f"{where}[{j}]"),
                        "arguments": json.dumps(call_input),
                    },
                }
            )
        else:
            raise _unsupported(f"{where}[{j}]", kind)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def _user(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        kind = _kind(block, f"{where}[{j}]")
        if kind == "text":
            texts.append(_str(block, "text", f"{where}[{j}]"))
        elif kind == "tool_result":
            if texts:  # text before a result: its own user turn, kept in order
                out.append({"role": "user", "content": "".join(texts)})
                texts = []
            result = _text(block.get("content", ""), f"{where}[{j}].content")
            if block.get("is_error"):
                result = f"Error: {result}"
            call_id = _str(block, "tool_use_id", f"{where}[{j}]")
            out.append({"role": "tool", "tool_call_id": call_id, "content": result})
        else:
            raise _unsupported(f"{where}[{j}]", kind)
    if texts or not out:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _text(content: Any, where: str) -> str:
    """A string, or text blocks, as one string (blocks joined by newlines)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(where, "must be a string or a list of text blocks")
    parts = []
    for j, block in enumerate(content):
        kind = _kind(block, f"{where}[{j}]")
        if kind != "text":
            raise _unsupported(f"{where}[{j}]", kind)
        parts.append(_str(block, "text", f"{where}[{j}]"))
    return "\n".join(parts)


def _kind(block: Any, where: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise _bad(f"{where}.type", "a content block needs a string 'type'")
    return str(block["type"])


def _str(block: dict[str, Any], key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise _bad(f"{where}.{key}", f"{where}.{key} must be a string")
    return value


def _chat_tool(i: int, tool: dict[str, Any]) -> dict[str, Any]:
    kind = tool.get("type", "custom")
    if kind != "custom":
        raise _bad(
            f"tools[{i}].type",
            f"tool type {kind!r} is not supported: this server runs client tools only "
            "(name, description, input_schema)",
        )
    if not isinstance(tool.get("input_schema"), dict):
        raise _bad(f"tools[{i}].input_schema", "a tool needs an input_schema object")
    fn = {"name": tool.get("name"), "parameters": tool["input_schema"]}
    if tool.get("description") is not None:
        fn["description"] = tool["description"]
    return {"type": "function", "function": fn}


def _chat_tool_choice(choice: dict[str, Any]) -> tuple[str | dict[str, Any], bool]:
    """(OpenAI's tool_choice, parallel_tool_calls) for an Anthropic tool_choice."""
    kind = choice.get("type")
    parallel = not choice.get("disable_parallel_tool_use", False)
    if kind in _CHOICES:
        return _CHOICES[kind], parallel
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise _bad(
        "tool_choice",
        'tool_choice is {"type": "auto" | "any" | "none"} or {"type": "tool", "name": NAME}',
    )


def _unsupported(where: str, kind: str) -> APIError:
    return _bad(
        f"{where}.type",
        f"content block type {kind!r} is not supported here (this server takes text, tool_use "
        "and tool_result blocks)",
    )


def _bad(param: str, message: str) -> APIError:
    return APIError(message, param=param, code="invalid_value")

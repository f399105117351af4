"""OpenAI's Responses API request (`POST /v1/responses`), checked and translated into a chat
completion request.

Taken: `input` (a string, or items: messages with role user / system / developer / assistant and
content as a string or input_text / output_text parts; function_call and function_call_output
items), `instructions`, function `tools` (flat: {type, name, description, parameters, strict}),
`tool_choice` (none / auto / required / {type: function, name}), `parallel_tool_calls`,
`max_output_tokens`, `temperature`, `top_p`, `text.format` (text / json_object / json_schema),
`stream`, `store`, `previous_response_id`, `metadata` (echoed), and RadixKV's extensions
(`cache_salt`, `session_id`, `priority`, `seed`, `top_k`, `ignore_eos`). Ignored as hints:
`user`, `safety_identifier`, `prompt_cache_key`, `service_tier`, `stream_options`,
`text.verbosity`. Refused with a 400 naming the field: built-in tools (web_search, file_search,
computer use, code_interpreter, mcp, ...), `background`, `conversation`, `prompt` templates,
`include`, `reasoning`, `max_tool_calls`, `top_logprobs`, `truncation: auto`, and input items
other than the three above (reasoning, item_reference, images, files, ...)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from radixkv.server.apis.bridge import chat_request
from radixkv.server.errors import APIError
from radixkv.server.openai.protocol import ChatCompletionRequest

# The chat path's field names → this API's, for errors raised on the chat path.
RESPONSES_NAMES = {
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    ".function.parameters": ".parameters",
    ".function.name": ".name",
}


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: dict[str, Any] | None = None
    stream: bool | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    truncation: str | None = None
    # Refused when set (checked in `refuse_unsupported`).
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None
    # RadixKV extensions (an OpenAI client sends them through `extra_body`).
    cache_salt: str | None = Field(default=None, max_length=256)
    session_id: str | None = Field(default=None, min_length=1, max_length=256)
    priority: int = 0
    seed: int | None = None
    top_k: int | None = None
    ignore_eos: bool = False

    def refuse_unsupported(self) -> None:
        """400 for every field this server cannot honour, naming it."""
        refused = {
            "background": bool(self.background),
            "conversation": self.conversation is not None,
            "prompt": self.prompt is not None,
            "include": bool(self.include),
            "reasoning": any(v is not None for v in (self.reasoning or {}).values()),
            "max_tool_calls": self.max_tool_calls is not None,
            "top_logprobs": bool(self.top_logprobs),
            "truncation": self.truncation not in (None, "disabled"),
        }
        for field, bad in refused.items():
            if bad:
                raise APIError(
                    f"{field} is not supported by this server's Responses API",
                    param=field,
                    code="unsupported_parameter",
                )

    def chat(self, history: list[dict[str, Any]]) -> ChatCompletionRequest:
        """The chat completion request this runs as, after the stored `history` items."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": chat_messages(self.instructions, [*history, *self.input_items()]),
            "max_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "response_format": _response_format(self.text),
            "cache_salt": self.cache_salt,
            "session_id": self.session_id,
            "priority": self.priority,
            "seed": self.seed,
            "top_k": self.top_k,
            "ignore_eos": self.ignore_eos,
        }
        if self.tools:
            body["tools"] = [_chat_tool(i, t) for i, t in enumerate(self.tools)]
        if self.tool_choice is not None:
            body["tool_choice"] = _chat_tool_choice(self.tool_choice)
        if self.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = self.parallel_tool_calls
        return chat_request(body)

    def input_items(self) -> list[dict[str, Any]]:
        """`input` as items (a string is one user message)."""
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": self.input}]
        return self.input


def chat_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items → chat messages. `instructions` and the leading system / developer messages
    become one system message; an assistant message and the function_call items after it are
    one assistant turn; each function_call_output is a `tool` message."""
    out: list[dict[str, Any]] = []
    system = [instructions] if instructions else []
    names: dict[str, str] = {}  # call_id → function name, for the tool messages
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise _bad(
                    f"{where}.role", f"role {role!r} is not user, system, developer or assistant"
                )
            text = _text(item.get("content"), f"{where}.content")
            if role in ("system", "developer") and not out:
                system.append(text)
            else:
                out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            call_id, name = _str(item, "call_id", where), _str(item, "name", where)
            names[call_id] = name
            arguments = item.get("arguments", "{}")
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": _json_text(arguments, where)},
            }
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = _str(item, "call_id", where)
            message = {
                "role": "tool",
                "tool_call_id": call_id,
                "content": _text(item.get("output"), f"{where}.output"),
            }
            if call_id in names:
                message["name"] = names[call_id]
            out.append(message)
        else:
            raise _bad(
                f"{where}.type",
                f"input item type {kind!r} is not supported (this "
                "server takes message, function_call and function_call_output items)",
            )
    if system:
        out.insert(0, {"role": "system", "content": "\n\n".join(system)})
    if not any(m["role"] != "system" for m in out):
        raise _bad("input", "input has no message to answer")
    return out


def _text(content: Any, where: str) -> str:
    """A message's content (a string, or text parts) as one string."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(where, "content must be a string or a list of text parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        else:
            raise _bad(
                f"{where}[{j}].type",
                f"content part type {kind!r} is not supported (this server takes text only)",
            )
    return "".join(texts)


def _str(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise _bad(f"{where}.{key}", f"{where}.{key} must be a non-empty string")
    return value


def _json_text(arguments: Any, where: str) -> str:
    if isinstance(arguments, str):
        return arguments
    if isinstance(arguments, dict):
        return json.dumps(arguments)
    raise _bad(f"{where}.arguments", "arguments must be a JSON string")


def _chat_tool(i: int, tool: dict[str, Any]) -> dict[str, Any]:
    kind = tool.get("type")
    if kind != "function":
        raise _bad(
            f"tools[{i}].type",
            f"tool type {kind!r} is not supported: this server runs "
            "function tools only (no built-in tools)",
        )
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    return {"type": "function", "function": fn}


def _chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice  # none / auto / required, checked on the chat path
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _bad(
        "tool_choice",
        'tool_choice must be none, auto, required or {"type": "function", "name": NAME}',
    )


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    raise _bad(
        "text.format.type",
        f"text.format type {fmt.get('type')!r} is not text, json_object or json_schema",
    )


def _bad(param: str, message: str) -> APIError:
    return APIError(message, param=param, code="invalid_value")

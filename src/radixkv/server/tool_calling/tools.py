"""Tool calling on /v1/chat/completions: the request's tools, checked; the grammar that enforces
`tool_choice` required / named; the parser an answer is read with; the prompt rendered with the
tool list through the model's own chat template.

`tool_choice` (OpenAI semantics; default `auto` when tools are given, else `none`):
  none      tools are rendered into the prompt, the output is plain content
  auto      the model may call; its output is read by the format's parser (`--tool-call-parser`,
            else the one the chat template points to)
  required  the output is forced (llguidance, the engine's JSON-schema grammar) to a JSON array
            of one or more `{"name", "arguments"}` objects, each valid for its tool's schema;
            one only when `parallel_tool_calls` is false
  named     the output is forced to the arguments object of that function
Under `auto` a call, once its format's start marker appears in the text (`<tool_call>` for hermes,
`{"name":` for llama3_json), is constrained to a given tool's name and schema by a lazy llguidance
grammar; the text around calls stays free (pythonic calls are not constrained).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

import jsonschema
from llguidance import StructTag
from pydantic import BaseModel, ConfigDict

from radixkv.server.errors import APIError
from radixkv.server.tool_calling.tool_parsers import (
    PARSERS,
    NamedJsonParser,
    RequiredJsonParser,
    ToolParser,
)

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# OpenAI: a function without `parameters` takes none (so a forced call's arguments are `{}`).
EMPTY_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {},
    "additionalProperties": False,
}


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionSpec


class FunctionCallIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: str = "{}"


class ToolCallIn(BaseModel):
    """A tool call of an earlier assistant turn, as the client sends it back."""

    model_config = ConfigDict(extra="ignore")
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn

    def for_template(self) -> dict[str, Any]:
        # Templates index into arguments (`tool_call.arguments | items`): give them the object.
        try:
            args: Any = json.loads(self.function.arguments)
        except ValueError:
            args = self.function.arguments
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.function.name, "arguments": args},
        }


Mode = Literal["none", "auto", "required", "named"]


def tool_mode(
    tools: list[ToolSpec] | None, choice: str | dict[str, Any] | None
) -> tuple[Mode, str | None]:
    """(mode, function name for `named`), the choice checked against the tools (400 if wrong)."""
    if choice is None:
        return ("auto" if tools else "none"), None
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise APIError(
                f"tool_choice {choice!r} is not one of none, auto, required or a function",
                param="tool_choice",
                code="invalid_value",
            )
        if choice != "none" and not tools:
            raise APIError(
                f"tool_choice {choice!r} needs tools", param="tool_choice", code="invalid_value"
            )
        return choice, None  # type: ignore[return-value]
    fn = choice.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    if choice.get("type") != "function" or not isinstance(name, str):
        raise APIError(
            'a named tool_choice is {"type": "function", "function": {"name": NAME}}',
            param="tool_choice",
            code="invalid_value",
        )
    if name not in {t.function.name for t in tools or ()}:
        raise APIError(
            f"tool_choice names function {name!r}, which is not among the tools",
            param="tool_choice",
            code="invalid_value",
        )
    return "named", name


def check_tools(tools: list[ToolSpec]) -> None:
    """Names valid and unique, parameters a valid JSON Schema of an object (400 otherwise)."""
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        fn = tool.function
        where = f"tools[{i}].function"
        if not _NAME.match(fn.name):
            raise APIError(
                f"{where}.name {fn.name!r} must be 1-64 letters, digits, '_' or '-'",
                param=f"{where}.name",
                code="invalid_value",
            )
        if fn.name in seen:
            raise APIError(
                f"{where}.name {fn.name!r} is given twice",
                param=f"{where}.name",
                code="invalid_value",
            )
        seen.add(fn.name)
        schema = parameters_of(tool)
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise APIError(
                f"{where}.parameters is not a valid JSON Schema: {exc.message}",
                param=f"{where}.parameters",
                code="invalid_value",
            ) from None
        if schema.get("type", "object") != "object":
            raise APIError(
                f"{where}.parameters must describe an object (type 'object')",
                param=f"{where}.parameters",
                code="invalid_value",
            )


def parameters_of(tool: ToolSpec) -> dict[str, Any]:
    return tool.function.parameters if tool.function.parameters is not None else EMPTY_PARAMETERS


def constraint_schema(
    tools: list[ToolSpec], mode: Mode, name: str | None, parallel: bool
) -> str | None:
    """The JSON Schema (as text) the output must follow, for required / named; else None."""
    if mode == "named":
        tool = next(t for t in tools if t.function.name == name)
        return json.dumps(parameters_of(tool))
    if mode != "required":
        return None
    item = {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "name": {"const": t.function.name},
                    "arguments": parameters_of(t),
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ]
    }
    array: dict[str, Any] = {"type": "array", "items": item, "minItems": 1}
    if not parallel:
        array["maxItems"] = 1
    return json.dumps(array)


@dataclass(frozen=True)
class ToolPlan:
    """How a request's output is read: the parser, whether only one call is kept, and whether
    a grammar forces the calls (tool_choice required / named)."""

    parser: ToolParser
    single: bool
    forced: bool = False
    grammar: str | None = None  # the lazy grammar of `auto` calls (llguidance Lark)


# Per format: (trigger, how a call of NAME begins after it, how it ends) for `auto` grammars.
_CALL_SHAPES = {
    "hermes": ("<tool_call>", '<tool_call>\n{{"name": "{}", "arguments": ', "}\n</tool_call>"),
    "llama3_json": ('{"name":', '{{"name": "{}", "parameters": ', "}"),
}


def auto_grammar(parser: str | None, tools: list[ToolSpec]) -> str | None:
    """A grammar that leaves text free but holds every call of format `parser`, from its start
    marker on, to one of `tools` with arguments valid for its schema (None: not for this format)."""
    shape = _CALL_SHAPES.get(parser or "")
    if shape is None or not tools:
        return None
    trigger, begin, end = shape
    tags = [
        StructTag(
            trigger=trigger,
            begin=begin.format(t.function.name),
            grammar=parameters_of(t),
            end=end,
        )
        for t in tools
    ]
    return StructTag.to_grammar(tags, assume_special=False)


def output_parser(mode: Mode, name: str | None, configured: str | None) -> ToolParser | None:
    """The parser for this mode: the grammar's shape for required / named, else the format's."""
    if mode == "named":
        return NamedJsonParser(name or "")
    if mode == "required":
        return RequiredJsonParser()
    if mode == "auto" and configured is not None:
        return PARSERS[configured]()
    return None


def render_with_tools(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[ToolSpec] | None
) -> str:
    """The prompt text: `messages` and `tools` (OpenAI shape) through the model's chat template,
    as `apply_chat_template(messages, tools=tools, add_generation_prompt=True)` renders it.
    400 when the template cannot show tools or tool calls."""
    source: str | None = getattr(tokenizer, "chat_template", None)
    if not source:
        raise APIError("this model has no chat template", param="messages")
    if tools and "tools" not in source:
        raise APIError(
            "this model's chat template does not support tools", param="tools", code="unsupported"
        )
    if any("tool_calls" in m for m in messages) and "tool_calls" not in source:
        raise APIError(
            "this model's chat template does not render assistant tool_calls",
            param="messages",
            code="unsupported",
        )
    tool_list = None
    if tools:
        tool_list = [t.model_dump(exclude_none=True) for t in tools]
        for spec, tool in zip(tool_list, tools, strict=True):
            spec["function"]["parameters"] = parameters_of(tool)
    return str(tokenizer.render_chat(messages, True, tools=tool_list))

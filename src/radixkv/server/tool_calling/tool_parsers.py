"""Tool-call parsers: a model's output text → content and tool calls, one parser per format.

Every parser answers `parse(text, final)`. With `final=False` the text is a prefix of the output
(streaming): `content` holds only text that can no longer turn into a tool call (a trailing piece
of a start marker is held back) and calls may be partial (`complete=False`, arguments parsed by
`partial_json_parser` so far). With `final=True` the text is the whole output: every returned call
is complete and valid; if any call is malformed, the whole text is content and there are no calls.

Formats, by the names vLLM and SGLang use for `--tool-call-parser`:
  hermes       `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, repeated (Qwen2.5/3)
  llama3_json  `{"name": ..., "parameters": {...}}`, `;`-separated, optional `<|python_tag|>`
  pythonic     `[get_weather(city="Paris"), ...]` (Llama 3.2 / 4 style Python call lists)
Two more, internal, read what the grammar of `tool_choice` required / named forces: a JSON array of
`{"name", "arguments"}` objects, and the bare arguments object of the named function.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from partial_json_parser import Allow
from partial_json_parser import loads as partial_loads

# Partial strings allowed (they only grow), partial numbers and literals not (`12` may be `123`).
_ARGS_ALLOW = Allow.ALL & ~Allow.NUM & ~Allow.SPECIAL
_NAME_ALLOW = Allow.ALL & ~Allow.STR  # a name counts only once its string is closed


@dataclass
class CallSnapshot:
    """One tool call as far as it has been read; `arguments` is None until any are seen."""

    name: str | None
    arguments: dict[str, Any] | None = None
    complete: bool = False


@dataclass
class Parsed:
    content: str
    calls: list[CallSnapshot] = field(default_factory=list)


class ToolParser:
    """Base: the whole text is content. Subclasses override `parse`."""

    name: ClassVar[str] = ""

    def parse(self, text: str, final: bool) -> Parsed:
        return Parsed(text)


def held_back(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def _partial(text: str, allow: Any) -> Any:
    try:
        return partial_loads(text, allow)
    except Exception:  # not (yet) JSON at all
        return None


def call_from_json(
    obj: Any, args_key: tuple[str, ...] = ("arguments", "parameters")
) -> CallSnapshot:
    """A complete call from a decoded `{"name": str, "arguments": object}`; ValueError if not."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError("a tool call needs a string 'name'")
    args: Any = next((obj[k] for k in args_key if k in obj), {})
    if isinstance(args, str):  # some models emit the arguments JSON-encoded
        args = json.loads(args)
    if not isinstance(args, dict):
        raise ValueError("tool call arguments must be a JSON object")
    return CallSnapshot(obj["name"], args, complete=True)


def partial_call(
    text: str, args_key: tuple[str, ...] = ("arguments", "parameters")
) -> CallSnapshot:
    """A call read from a prefix of its JSON object (name only once complete)."""
    named = _partial(text, _NAME_ALLOW)
    name = named.get("name") if isinstance(named, dict) else None
    obj = _partial(text, _ARGS_ALLOW)
    args = next((obj[k] for k in args_key if k in obj), None) if isinstance(obj, dict) else None
    return CallSnapshot(
        name if isinstance(name, str) else None, args if isinstance(args, dict) else None
    )


class HermesParser(ToolParser):
    """`<tool_call>` JSON `</tool_call>` blocks; text before the first block is content."""

    name = "hermes"
    start, end = "<tool_call>", "</tool_call>"

    def parse(self, text: str, final: bool) -> Parsed:
        idx = text.find(self.start)
        if idx < 0:
            keep = 0 if final else held_back(text, self.start)
            return Parsed(text[: len(text) - keep])
        calls: list[CallSnapshot] = []
        for block in text[idx + len(self.start) :].split(self.start):
            body, closed, _ = block.partition(self.end)
            body = body.strip()
            if closed or final:
                try:
                    calls.append(call_from_json(json.loads(body)))
                except ValueError:
                    if final:
                        return Parsed(text)
                    calls.append(partial_call(body))
            else:
                calls.append(partial_call(body))
        return Parsed(text[:idx], calls)


class Llama3JsonParser(ToolParser):
    """Llama 3.x JSON calls: the output is one or more `;`-separated call objects, or content."""

    name = "llama3_json"
    tag = "<|python_tag|>"

    def parse(self, text: str, final: bool) -> Parsed:
        body = text.lstrip()
        if body.startswith(self.tag):
            body = body[len(self.tag) :].lstrip()
        elif not final and self.tag.startswith(body):
            return Parsed("")  # too early to tell content from a call
        if not final and not body:
            return Parsed("")
        if not body.startswith("{"):
            return Parsed(text)
        decoder, calls, pos = json.JSONDecoder(), [], 0
        while pos < len(body):
            while pos < len(body) and body[pos] in " \t\r\n;":
                pos += 1
            if pos == len(body):
                break
            try:
                obj, pos = decoder.raw_decode(body, pos)
                calls.append(call_from_json(obj))
            except ValueError:
                if final:
                    return Parsed(text)
                calls.append(partial_call(body[pos:]))
                break
        return Parsed("", calls)


class PythonicParser(ToolParser):
    """A Python list of calls with keyword arguments of literal values, or content.

    Streaming reports a call once its closing parenthesis is there (arguments whole)."""

    name = "pythonic"
    open_tag, close_tag = "<|python_start|>", "<|python_end|>"

    def parse(self, text: str, final: bool) -> Parsed:
        body = text.strip()
        if body.startswith(self.open_tag):
            body = body[len(self.open_tag) :].removesuffix(self.close_tag).strip()
        elif not final and self.open_tag.startswith(body):
            return Parsed("")
        if not final and not body:
            return Parsed("")
        if not body.startswith("["):
            return Parsed(text)
        if final:
            calls = _python_calls(body)
            return Parsed(text) if calls is None else Parsed("", calls)
        for attempt in (body, body + "]", body.rstrip().rstrip(",") + "]"):
            calls = _python_calls(attempt)
            if calls is not None:
                return Parsed("", calls)
        return Parsed("")


def _python_calls(source: str) -> list[CallSnapshot] | None:
    """`[f(a=1), g(b="x")]` → calls; None when it is not exactly such a list."""
    try:
        tree = ast.parse(source, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.List):
        return None
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        if any(kw.arg is None for kw in node.keywords):  # `**kwargs`
            return None
        try:
            args = {str(kw.arg): ast.literal_eval(kw.value) for kw in node.keywords}
            json.dumps(args)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return None
        calls.append(CallSnapshot(node.func.id, args, complete=True))
    return calls


class RequiredJsonParser(ToolParser):
    """What `tool_choice: required` forces: a JSON array of `{"name", "arguments"}` objects."""

    name = "json_array"

    def parse(self, text: str, final: bool) -> Parsed:
        if final:
            try:
                items = json.loads(text)
                if not isinstance(items, list):
                    raise ValueError("not a JSON array")
                return Parsed("", [call_from_json(item) for item in items])
            except ValueError:
                return Parsed(text)
        names = _partial(text, _NAME_ALLOW)
        values = _partial(text, _ARGS_ALLOW)
        if not isinstance(names, list) or not isinstance(values, list):
            return Parsed("")
        calls = []
        for i, item in enumerate(names):
            name = item.get("name") if isinstance(item, dict) else None
            value = values[i] if i < len(values) and isinstance(values[i], dict) else {}
            args = value.get("arguments")
            calls.append(
                CallSnapshot(
                    name if isinstance(name, str) else None,
                    args if isinstance(args, dict) else None,
                    complete=i < len(names) - 1,
                )
            )
        return Parsed("", calls)


class NamedJsonParser(ToolParser):
    """What a named `tool_choice` forces: the arguments object of that one function."""

    name = "json_named"

    def __init__(self, function: str) -> None:
        self.function = function

    def parse(self, text: str, final: bool) -> Parsed:
        if final:
            try:
                args = json.loads(text)
            except ValueError:
                return Parsed(text)
            if not isinstance(args, dict):
                return Parsed(text)
            return Parsed("", [CallSnapshot(self.function, args, complete=True)])
        obj = _partial(text, _ARGS_ALLOW)
        return Parsed("", [CallSnapshot(self.function, obj if isinstance(obj, dict) else None)])


PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesParser, Llama3JsonParser, PythonicParser)
}


def parser_for_template(template: str | None) -> str | None:
    """The parser a chat template's own tool-call instructions point to (None: unknown)."""
    if not template:
        return None
    if "<tool_call>" in template:
        return HermesParser.name
    if "<|python_start|>" in template or "[func_name1(" in template:
        return PythonicParser.name
    if "<|python_tag|>" in template or '"parameters": dictionary' in template:
        return Llama3JsonParser.name
    return None

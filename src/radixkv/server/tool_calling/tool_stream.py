"""One choice's tool calls: streamed `tool_calls` deltas and the final assistant message.

A `ToolCallStream` re-parses the text so far on every delta (outputs are short: 50-200 tokens) and
turns the difference from what it already sent into one OpenAI chunk delta. The contract, per
choice: the concatenated `content` deltas equal the final message's content prefix it streamed,
and, per call index, the first delta carries `id`, `type` and `function.name` and the
concatenated `function.arguments` pieces equal the final `json.dumps` of that call's arguments.
So only what cannot change is sent early: a partial arguments object is dumped and cut before
its trailing closers (`"`, `}`, `]`), and partial numbers and literals are left out of it
(tool_parsers), so a later, longer dump always starts with what was sent.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

from radixkv.server.tool_calling.tool_parsers import CallSnapshot, Parsed, ToolParser

log = logging.getLogger("radixkv.server")


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def _stable(call: CallSnapshot) -> str:
    """The part of this call's arguments JSON that no later text can change."""
    if call.complete:
        return json.dumps(call.arguments if call.arguments is not None else {})
    if call.arguments is None:
        return ""
    return json.dumps(call.arguments).rstrip('"]}')


@dataclass
class _Sent:
    id: str
    name: str
    arguments: str = ""


@dataclass
class ToolCallStream:
    """Parses one choice's output with `parser`; `single` keeps only the first call
    (`parallel_tool_calls: false`)."""

    parser: ToolParser
    single: bool = False
    text: str = ""
    _content: str = ""
    _calls: list[_Sent] = field(default_factory=list)

    @property
    def called(self) -> bool:
        """True once a tool call has been sent (or, after `finish`, found)."""
        return bool(self._calls)

    def _parse(self, final: bool) -> Parsed:
        parsed = self.parser.parse(self.text, final)
        if self.single:
            parsed.calls = parsed.calls[:1]
        return parsed

    def feed(self, new_text: str) -> dict[str, Any]:
        """The chunk delta (maybe empty) after `new_text` more output."""
        self.text += new_text
        return self._diff(self._parse(final=False))

    def finish(self) -> dict[str, Any]:
        """The last delta: whatever the whole output adds to what was streamed."""
        return self._diff(self._parse(final=True))

    def _diff(self, parsed: Parsed) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        if parsed.content.startswith(self._content) and len(parsed.content) > len(self._content):
            delta["content"] = parsed.content[len(self._content) :]
            self._content = parsed.content
        items: list[dict[str, Any]] = []
        for i, call in enumerate(parsed.calls):
            if i == len(self._calls):
                if call.name is None:
                    break
                self._calls.append(_Sent(new_call_id(), call.name))
                items.append(
                    {
                        "index": i,
                        "id": self._calls[i].id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": ""},
                    }
                )
            sent, stable = self._calls[i], _stable(call)
            if not stable.startswith(sent.arguments):
                log.warning("tool call %d: arguments diverged from what was streamed", i)
                continue
            if len(stable) > len(sent.arguments):
                piece = stable[len(sent.arguments) :]
                sent.arguments = stable
                if items and items[-1]["index"] == i:
                    items[-1]["function"]["arguments"] += piece
                else:
                    items.append({"index": i, "function": {"arguments": piece}})
        if items:
            delta["tool_calls"] = items
        return delta

    def message(self, text: str) -> dict[str, Any]:
        """The non-streaming assistant message for the whole output `text`."""
        self.text = text
        parsed = self._parse(final=True)
        if not parsed.calls:
            return {"role": "assistant", "content": text}
        calls = []
        for call in parsed.calls:
            sent = _Sent(new_call_id(), call.name or "", json.dumps(call.arguments or {}))
            self._calls.append(sent)
            calls.append(
                {
                    "id": sent.id,
                    "type": "function",
                    "function": {"name": sent.name, "arguments": sent.arguments},
                }
            )
        content = parsed.content if parsed.content.strip() else None
        return {"role": "assistant", "content": content, "tool_calls": calls}

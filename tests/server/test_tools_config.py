"""`--tool-call-parser`: the flag reaches the server, unknown names are refused; malformed tools
and tool choices, and tools for a model without a chat template, get a 400 naming the field
(fast: the fake engine; checks run before any template or engine)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_fakes import FakeEngine
from server_harness import LiveServer, live_server

from radixkv.engine.types import EngineConfig

TOOL: Any = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
TOOLS = [TOOL, {"type": "function", "function": {"name": "g"}}]
ASK = [{"role": "user", "content": "hi"}]


def _parse(*argv: str) -> EngineConfig:
    parser = EngineConfig.add_args(argparse.ArgumentParser(), server=True)
    return EngineConfig.from_args(parser.parse_args(list(argv)))


def test_the_flag_sets_the_servers_parser() -> None:
    assert _parse().server.tool_call_parser is None
    cfg = _parse("--tool-call-parser", "pythonic")
    assert cfg.server.tool_call_parser == "pythonic"
    with pytest.raises(SystemExit):
        _parse("--tool-call-parser", "mistral-ish")
    with live_server(FakeEngine(cfg)) as srv:
        assert srv.state.tool_call_parser == "pythonic"
    with live_server(FakeEngine()) as srv:  # no template to read a format from
        assert srv.state.tool_call_parser is None


@pytest.mark.parametrize("choice", ["auto", "required", "none"])
def test_tools_without_a_chat_template_are_400(choice: str) -> None:
    with live_server(FakeEngine()) as srv:
        body: dict[str, Any] = {
            "messages": ASK,
            "tools": [TOOL],
            "tool_choice": choice,
        }
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=10)
        assert r.status_code == 400, r.text
        assert "chat template" in r.json()["error"]["message"]
        # The same request without tools is served.
        del body["tools"], body["tool_choice"]
        ok = httpx.post(srv.url + "/v1/chat/completions", json={**body, "max_tokens": 2})
        assert ok.status_code == 200 and "tool_calls" not in ok.json()["choices"][0]["message"]


BAD = [
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}],
     "auto", "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
     "auto", "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"properties": 3}}}],
     "required", "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "no spaces"}}], "auto", "tools[0].function.name"),
    ([TOOLS[0], TOOLS[0]], "auto", "tools[1].function.name"),
    ([{"type": "retrieval", "function": {"name": "f"}}], "auto", "tools"),
    ([{"type": "function", "function": {"name": "f", "parameters": [1]}}], "auto", "tools"),
    (TOOLS, {"type": "function", "function": {"name": "missing"}}, "tool_choice"),
    (TOOLS, "sometimes", "tool_choice"),
    (None, "required", "tool_choice"),
]  # fmt: skip


@pytest.fixture(scope="module")
def srv() -> Iterator[LiveServer]:
    with live_server(FakeEngine()) as server:
        yield server


@pytest.mark.parametrize("tools,choice,param", BAD)
def test_bad_tools_and_choices_are_400(
    srv: LiveServer, tools: Any, choice: Any, param: str
) -> None:
    body: dict[str, Any] = {"messages": ASK, "tool_choice": choice}
    if tools is not None:
        body["tools"] = tools
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] is not None and err["param"].startswith(param), err
    assert "chat template" not in err["message"]  # refused for the tools, not the template

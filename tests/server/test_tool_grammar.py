"""`tool_choice: auto` grammars: free text, and once a call's start marker appears, only a given
tool's name and schema-valid arguments. Checked token by token on the engine's own grammar
compiler (llguidance) with the SmolLM2 tokenizer, then through a real server."""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from server_harness import live_server
from tokenizers import Tokenizer

import radixkv.server.openai.prompts as prompts_module
from radixkv.engine.engine import Engine
from radixkv.engine.sampling.grammar import GrammarCompiler
from radixkv.engine.types import EngineConfig
from radixkv.server.engine_link.engine_proc import ProcessEngine
from radixkv.server.engine_link.launch import close_server_engine
from radixkv.server.tool_calling.tools import ToolSpec, auto_grammar

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "maximum": 14}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time"}},
]
SPECS = [ToolSpec.model_validate(t) for t in TOOLS]
HERMES_OK = [
    "Just text, no call at all.",
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
    '"days": 3}}\n</tool_call>',
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n<tool_call>\n'
    '{"name": "get_weather", "arguments": {"city": "Oslo", "days": 14}}\n</tool_call>Done.',
]
HERMES_BAD = [  # each one complete: only the tools' names and schemas refuse it
    '<tool_call>\n{"name": "get_wether", "arguments": {}}\n</tool_call>',  # no such tool
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 99}}\n'
    "</tool_call>",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": 5, "days": 1}}\n</tool_call>',
]
LLAMA3_OK = ['{"name": "get_weather", "parameters": {"city": "Rome", "days": 1}}', "Hi there"]
LLAMA3_BAD = ['{"name": "get_weather", "parameters": {"town": "Rome"}}']


@pytest.fixture(scope="module")
def compiler(tiny_model_dir: Callable[..., Path]) -> tuple[GrammarCompiler, Tokenizer]:
    path = tiny_model_dir("llama") / "tokenizer.json"
    tok = Tokenizer.from_file(str(path))
    return GrammarCompiler(path.read_text(), tok.get_vocab_size(), [2]), tok


def _accepts(compiler: tuple[GrammarCompiler, Tokenizer], grammar: str, text: str) -> bool:
    """True if every token of `text` is allowed in turn; False if one is refused (the output
    may end after every text here, so failing only at its end is a test error)."""
    gc, tok = compiler
    matcher = gc.matcher(grammar, lark=True)
    for token in tok.encode(text, add_special_tokens=False).ids:
        if not bool(matcher.allowed()[token]):
            return False
        matcher.advance(token)
    assert bool(matcher.allowed()[2]), "a whole text must be allowed to end"
    return True


@pytest.mark.parametrize(
    "parser,text,ok",
    [("hermes", t, True) for t in HERMES_OK]
    + [("hermes", t, False) for t in HERMES_BAD]
    + [("llama3_json", t, True) for t in LLAMA3_OK]
    + [("llama3_json", t, False) for t in LLAMA3_BAD],
)
def test_auto_grammar_frees_text_and_holds_calls_to_the_tools(
    compiler: tuple[GrammarCompiler, Tokenizer], parser: str, text: str, ok: bool
) -> None:
    grammar = auto_grammar(parser, SPECS)
    assert grammar is not None
    assert _accepts(compiler, grammar, text) is ok


def test_no_auto_grammar_for_pythonic_or_without_tools() -> None:
    assert auto_grammar("pythonic", SPECS) is None
    assert auto_grammar("hermes", []) is None
    assert auto_grammar(None, SPECS) is None


def test_auto_requests_carry_the_grammar_and_run(
    tiny_model_dir: Callable[..., Path], tmp_path: Path
) -> None:
    """Through a server whose --tool-call-parser is hermes (its template names no format): the
    grammar compiles in the engine and the request is served; a response_format replaces it."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir("llama"), model)
    (model / "chat_template.jinja").write_text("{{ tools | tojson }}{{ messages[0].content }}")
    cfg = EngineConfig(num_slots=4096, max_model_len=1024, seed=0, tool_call_parser="hermes")
    with live_server(Engine(str(model), cfg), "m") as srv:
        assert srv.state.tool_call_parser == "hermes"
        body: dict[str, Any] = {
            "messages": [{"role": "user", "content": "weather?"}],
            "tools": TOOLS,
            "max_tokens": 24,
            "temperature": 1.0,
            "seed": 1,
        }
        rendered = httpx.post(srv.url + "/v1/chat/completions/render", json=body).json()
        structured = rendered["sampling_params"]["structured_outputs"]
        assert structured == {"grammar": auto_grammar("hermes", SPECS)}
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
        body["response_format"] = {"type": "json_object"}
        rendered = httpx.post(srv.url + "/v1/chat/completions/render", json=body).json()
        assert rendered["sampling_params"]["structured_outputs"] == {"json": {"type": "object"}}
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text


def _json(schema: dict[str, Any]) -> str:
    """`%json` of a schema, spaced as json.dumps spaces (so the text is what models write)."""
    spacing = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    return "%json " + json.dumps({**schema, "x-guidance": spacing})


SMALL = {
    **WEATHER,
    "properties": {**WEATHER["properties"], "city": {"type": "string", "pattern": "^[a-z]{1,8}$"}},
}
# Grammars that make the noise model write one format exactly (given in place of the auto one).
FORCE = {
    "hermes": 'start: "Sure.\\n<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": "'
    f' {_json(SMALL)} "}}\\n</tool_call>"',
    "llama3_json": 'start: "{\\"name\\": \\"get_weather\\", \\"parameters\\": "'
    f' {_json(SMALL)} "}}"',
    "pythonic": 'start: "[get_time(), get_weather(city=\\"" /[a-z]{1,8}/ "\\", days=" /[1-9]/ ")]"',
}


@pytest.mark.parametrize("parser", list(FORCE))
def test_auto_round_trips_each_format_through_the_server(
    tiny_model_dir: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parser: str,
) -> None:
    """The model writes the format (a grammar forces it here, in place of the auto grammar);
    the server reads it back into tool_calls, whole and streamed, with the `openai` client."""
    monkeypatch.setattr(prompts_module, "auto_grammar", lambda *_: FORCE[parser])
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir("llama"), model)
    (model / "chat_template.jinja").write_text("{{ tools | tojson }}{{ messages[0].content }}")
    cfg = EngineConfig(num_slots=4096, max_model_len=1024, seed=0, tool_call_parser=parser)
    with live_server(Engine(str(model), cfg), "m") as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        args: dict[str, Any] = dict(model="m", messages=[{"role": "user", "content": "go"}],
                                    tools=TOOLS, temperature=0, max_tokens=80)  # fmt: skip
        whole = client.chat.completions.create(**args).choices[0]
        assert whole.finish_reason == "tool_calls", whole.message
        calls = [(t.function.name, t.function.arguments) for t in whole.message.tool_calls or []]
        assert [n for n, _ in calls] == (["get_time"] if parser == "pythonic" else []) + [
            "get_weather"
        ]
        jsonschema.validate(json.loads(calls[-1][1]), SMALL)
        assert whole.message.content == ("Sure.\n" if parser == "hermes" else None)
        content, parts, finish = "", {}, None
        for chunk in client.chat.completions.create(**args, stream=True):
            for ch in chunk.choices:
                finish = ch.finish_reason or finish
                content += ch.delta.content or ""
                for d in ch.delta.tool_calls or []:
                    part = parts.setdefault(d.index, ["", ""])
                    part[0] += (d.function and d.function.name) or ""
                    part[1] += (d.function and d.function.arguments) or ""
        assert finish == "tool_calls" and content == (whole.message.content or "")
        assert [(p[0], p[1]) for _, p in sorted(parts.items())] == calls


def test_tool_calls_through_the_engine_process(
    tiny_model_dir: Callable[..., Path], tmp_path: Path
) -> None:
    """As `radixkv serve` runs: the engine in its own process (grammars cross ZeroMQ as text)."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir("llama"), model)
    (model / "chat_template.jinja").write_text("{{ tools | tojson }}{{ messages[0].content }}")
    cfg = EngineConfig(num_slots=4096, max_model_len=1024, seed=0, tool_call_parser="hermes")
    engine = ProcessEngine(functools.partial(Engine, str(model), cfg)).launch()
    try:
        with live_server(engine, "m") as srv:
            assert srv.state.tool_call_parser == "hermes"
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
            tools = [{"type": "function", "function": {"name": "get_weather", "parameters": SMALL}},
                     TOOLS[1]]  # fmt: skip
            ask: dict[str, Any] = dict(model="m", messages=[{"role": "user", "content": "go"}],
                                       tools=tools, max_tokens=100, seed=3)  # fmt: skip
            forced = client.chat.completions.create(
                **ask, tool_choice="required", parallel_tool_calls=False, n=4
            )
            for c in forced.choices:
                assert c.finish_reason == "tool_calls", c.message
                for t in c.message.tool_calls or []:
                    schema = SMALL if t.function.name == "get_weather" else {"maxProperties": 0}
                    jsonschema.validate(json.loads(t.function.arguments), schema)
            auto = client.chat.completions.create(**ask)  # with the auto grammar
            assert auto.choices[0].finish_reason in ("stop", "length", "tool_calls")
    finally:
        close_server_engine(engine)

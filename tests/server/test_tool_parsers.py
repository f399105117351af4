"""Tool-call parsers on the output formats models really emit, whole and streamed in pieces: the
deltas a client reassembles (OpenAI's rule: the first delta of an index has id / type / name,
later ones append arguments) must equal the non-streaming message, however the text is cut."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.config.sections import TOOL_CALL_PARSERS
from radixkv.server.tool_calling.tool_parsers import (
    PARSERS,
    HermesParser,
    Llama3JsonParser,
    NamedJsonParser,
    PythonicParser,
    RequiredJsonParser,
    ToolParser,
    parser_for_template,
)
from radixkv.server.tool_calling.tool_stream import ToolCallStream

WEATHER = {"city": "Paris", "unit": "celsius", "days": 3, "hourly": False, "note": None}
# (parser, output text, expected content, expected [(name, arguments)])
CASES: list[tuple[ToolParser, str, str | None, list[tuple[str, dict[str, Any]]]]] = [
    (  # Qwen2.5 / Qwen3: reasoning text, then one call
        HermesParser(),
        'Let me look that up.\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris", "unit": "celsius", "days": 3, "hourly": false, "note": null}}\n'
        "</tool_call>",
        "Let me look that up.\n",
        [("get_weather", WEATHER)],
    ),
    (  # two parallel calls, no content
        HermesParser(),
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich \\"ZH\\""}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Zurich",'
        ' "offsets": [1, -2.5, 1e3]}}\n</tool_call>',
        None,
        [
            ("get_weather", {"city": 'Zürich "ZH"'}),
            ("get_time", {"tz": "Europe/Zurich", "offsets": [1, -2.5, 1000.0]}),
        ],
    ),
    (  # Llama 3.1 / 3.2 JSON, with the python tag
        Llama3JsonParser(),
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": '
        '"celsius", "days": 3, "hourly": false, "note": null}}',
        None,
        [("get_weather", WEATHER)],
    ),
    (  # Llama 3 JSON, two calls separated by ';'
        Llama3JsonParser(),
        '{"name": "a", "parameters": {"x": {"y": [true, {}]}}}; {"name": "b", "parameters": {}}',
        None,
        [("a", {"x": {"y": [True, {}]}}), ("b", {})],
    ),
    (  # Llama 3.2 / 4 pythonic
        PythonicParser(),
        '[get_weather(city="Paris", unit="celsius", days=3, hourly=False, note=None), '
        "get_time(tz='UTC', offsets=[1, 2])]",
        None,
        [("get_weather", WEATHER), ("get_time", {"tz": "UTC", "offsets": [1, 2]})],
    ),
    (
        PythonicParser(),
        '<|python_start|>[get_weather(city="Paris")]<|python_end|>',
        None,
        [("get_weather", {"city": "Paris"})],
    ),
    (  # what tool_choice required forces
        RequiredJsonParser(),
        '[{"name":"get_weather","arguments":{"city":"Paris","days":12}},'
        '{"name":"get_time","arguments":{}}]',
        None,
        [("get_weather", {"city": "Paris", "days": 12}), ("get_time", {})],
    ),
    (  # what a named tool_choice forces
        NamedJsonParser("get_weather"),
        '{"city":"Paris","unit":"celsius","days":3,"hourly":false,"note":null}',
        None,
        [("get_weather", WEATHER)],
    ),
]
BROKEN = [  # a call that starts well and ends malformed (or cut off)
    (HermesParser(), '<tool_call>\n{"name": "f", "arguments": {broken}\n</tool_call>'),
    (Llama3JsonParser(), '{"name": "f", "parameters": {"x": 1}'),
]
PLAIN = [  # no call: everything is content
    (HermesParser(), "The weather in Paris is <tool sunny."),
    (Llama3JsonParser(), "Paris is sunny; {not a call}"),
    (PythonicParser(), "[1, 2, 3]"),
    (PythonicParser(), "I would call [get_weather(city='Paris')]"),
    (PythonicParser(), "[f(**kw)]"),
]


def _expected_message(content: str | None, calls: list[tuple[str, dict[str, Any]]]) -> Any:
    return content, [(n, json.dumps(a)) for n, a in calls]


def _whole(parser: ToolParser, text: str) -> Any:
    msg = ToolCallStream(parser).message(text)
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls", [])]
    for c in msg.get("tool_calls", []):
        assert c["type"] == "function" and c["id"].startswith("call_")
    return msg["content"], calls


def _streamed(parser: ToolParser, pieces: list[str]) -> Any:
    """Feed the pieces, reassemble the deltas as a client does, checking their shape."""
    stream = ToolCallStream(parser)
    deltas = [stream.feed(p) for p in pieces] + [stream.finish()]
    content, calls = "", {}
    for d in deltas:
        content += d.get("content", "")
        for item in d.get("tool_calls", []):
            i = item["index"]
            if i not in calls:
                assert i == len(calls), "calls start in index order"
                assert item["type"] == "function" and item["id"].startswith("call_")
                calls[i] = [item["function"]["name"], ""]
            else:
                assert set(item) == {"index", "function"} and set(item["function"]) == {"arguments"}
            calls[i][1] += item["function"]["arguments"]
    return content, [tuple(calls[i]) for i in range(len(calls))], stream.called


@pytest.mark.parametrize("case", range(len(CASES)))
def test_whole_output_parses(case: int) -> None:
    parser, text, content, calls = CASES[case]
    assert _whole(parser, text) == _expected_message(content, calls)


@pytest.mark.parametrize("parser,text", PLAIN)
def test_malformed_or_plain_output_is_content(parser: ToolParser, text: str) -> None:
    assert _whole(parser, text) == (text, [])
    content, calls, called = _streamed(parser, list(text))
    assert calls == [] and not called
    assert content == text


@pytest.mark.parametrize("parser,text", BROKEN)
def test_a_broken_call_is_content_whole_and_streamed_ends_with_it(
    parser: ToolParser, text: str
) -> None:
    """Streaming cannot take back a call it sent once its name was complete; the rest of the
    text still reaches the client, as content, when the output turns out malformed."""
    assert _whole(parser, text) == (text, [])
    content, calls, _ = _streamed(parser, list(text))
    assert content == text and [c[0] for c in calls] == ["f"]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_streamed_char_by_char_and_random_cuts_equal_whole(case: int) -> None:
    parser, text, content, calls = CASES[case]
    want_content, want_calls = _expected_message(content, calls)
    rng = random.Random(case)
    cuts = [list(text)] + [_cut(text, rng) for _ in range(20)]
    for pieces in cuts:
        got_content, got_calls, called = _streamed(parser, pieces)
        assert got_calls == want_calls and called
        assert got_content == (want_content or "")


def test_arguments_stream_before_the_call_ends() -> None:
    """Arguments are not held back to the end: a long string value streams as it grows."""
    stream = ToolCallStream(HermesParser())
    head = '<tool_call>\n{"name": "write", "arguments": {"text": "'
    first = stream.feed(head)
    assert first["tool_calls"][0]["function"] == {"name": "write", "arguments": '{"text": '}
    assert stream.feed("hello wor")["tool_calls"][0]["function"]["arguments"] == '"hello wor'
    assert stream.feed("ld")["tool_calls"][0]["function"]["arguments"] == "ld"
    assert stream.feed('"}}\n</tool_call>')["tool_calls"][0]["function"]["arguments"] == '"}'


def test_content_holds_back_a_partial_start_marker() -> None:
    stream = ToolCallStream(HermesParser())
    assert stream.feed("Sure <tool") == {"content": "Sure "}
    assert stream.feed("box>") == {"content": "<toolbox>"}


def test_single_call_keeps_the_first() -> None:
    text = CASES[1][1]
    msg = ToolCallStream(HermesParser(), single=True).message(text)
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["get_weather"]
    _, calls, _ = _streamed_single(text)
    assert [c[0] for c in calls] == ["get_weather"]


def _streamed_single(text: str) -> Any:
    stream = ToolCallStream(HermesParser(), single=True)
    deltas = [stream.feed(c) for c in text] + [stream.finish()]
    names = [i["function"]["name"] for d in deltas for i in d.get("tool_calls", []) if "id" in i]
    return None, [(n,) for n in names], None


def _cut(text: str, rng: random.Random) -> list[str]:
    points = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 12))))
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(-1e6, 1e6) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(
    args=st.dictionaries(st.text(max_size=6), _json, max_size=4),
    seed=st.integers(0, 2**16),
    fmt=st.sampled_from(["hermes", "llama3_json", "json_array", "json_named"]),
)
def test_any_arguments_stream_to_exactly_their_json(
    args: dict[str, Any], seed: int, fmt: str
) -> None:
    body = json.dumps(args, ensure_ascii=seed % 2 == 0)
    if fmt == "hermes":
        parser: ToolParser = HermesParser()
        text = f'<tool_call>\n{{"name": "f", "arguments": {body}}}\n</tool_call>'
    elif fmt == "llama3_json":
        parser, text = Llama3JsonParser(), f'{{"name": "f", "parameters": {body}}}'
    elif fmt == "json_array":
        parser, text = RequiredJsonParser(), f'[{{"name":"f","arguments":{body}}}]'
    else:
        parser, text = NamedJsonParser("f"), body
    _, calls, _ = _streamed(parser, _cut(text, random.Random(seed)))
    assert calls == [("f", json.dumps(args))]
    assert json.loads(calls[0][1]) == args


def test_parser_names_and_template_detection() -> None:
    assert tuple(PARSERS) == TOOL_CALL_PARSERS
    assert parser_for_template("... <tool_call>\n{...}\n</tool_call> ...") == "hermes"
    assert parser_for_template("{{- '<|python_tag|>' }}") == "llama3_json"
    assert parser_for_template("[func_name1(params_name1=params_value1)]") == "pythonic"
    assert parser_for_template("{{ message['content'] }}") is None
    assert parser_for_template(None) is None

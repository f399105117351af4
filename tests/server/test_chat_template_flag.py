"""`--chat-template`: a template from a file or inline replaces the checkpoint's for every chat
prompt the server renders, and names the tool-call parser when none is given; a mistyped path or
a template that does not compile is refused before the model loads."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from server_harness import live_server

from radixkv.config import EngineConfig
from radixkv.engine.engine import Engine
from radixkv.server.openai.prompts import load_chat_template

HERMES = (
    "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    "{% if tools %}Answer with <tool_call>{{ tools | tojson }}</tool_call>{% endif %}[assistant] "
)


def test_load_chat_template(tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text(HERMES)
    assert load_chat_template(str(path)) == HERMES
    assert load_chat_template(HERMES) == HERMES
    looped = "{% for m in messages %}{{ m.content }}{% break %}{% endfor %}"  # loopcontrols
    assert load_chat_template(looped) == looped
    with pytest.raises(ValueError, match="no such file"):
        load_chat_template(str(tmp_path / "missing.jinja"))
    with pytest.raises(ValueError, match="does not compile"):
        load_chat_template("{% for m in messages %}unclosed")


def test_server_renders_with_the_given_template(
    tiny_model_dir: Callable[..., Path], tmp_path: Path
) -> None:
    path = tmp_path / "hermes.jinja"
    path.write_text(HERMES)
    cfg = EngineConfig(num_slots=4096, max_model_len=1024, seed=0, chat_template=str(path))
    engine = Engine(tiny_model_dir("llama"), cfg)
    tok = engine.tokenizer
    with live_server(engine, "m") as srv:
        assert srv.state.tool_call_parser == "hermes"  # the template names <tool_call>
        body = {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 4}
        rendered = httpx.post(srv.url + "/v1/chat/completions/render", json=body).json()
        expected = tok.encode("[user] hi there\n[assistant] ")
        assert rendered["token_ids"] == list(expected)
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(expected)


@pytest.mark.parametrize("value", ["no/such/template.jinja", "{% if x %}never closed"])
def test_serve_refuses_a_bad_template_before_loading(value: str) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "radixkv",
            "serve",
            "--model",
            "no-such-model",
            "--chat-template",
            value,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    assert "--chat-template" in run.stderr

"""`radixkv chat` / `radixkv generate` / `radixkv serve` on the real engine (tiny model)."""

from __future__ import annotations

import io
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from radixkv.bench.serving.server_proc import wait_healthy
from radixkv.cli import build_parser, main

TURN = re.compile(r"\[turn (\d+): prompt (\d+) tokens, cached (\d+) \(\d+%\), generated (\d+),")
SMALL = ["--num-slots", "4096", "--max-model-len", "512"]


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir: Callable[..., Path]) -> Path:
    return tiny_model_dir("llama")


def test_chat_piped_stdin_shows_cache_hits(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hello there\n\nHow are you?\n/reset\nHi\n"))
    args = ["chat", "--model", str(model_dir), "--max-tokens", "5", "--ignore-eos", *SMALL]
    assert main([*args, "--system", "Be brief."]) == 0
    out = capsys.readouterr().out
    turns = [tuple(map(int, m)) for m in TURN.findall(out)]
    assert [t[0] for t in turns] == [1, 2, 3]
    assert out.count("assistant> ") == 3 and "[conversation reset]" in out
    (_, p1, c1, g1), (_, p2, c2, g2), (_, p3, c3, _) = turns
    assert c1 == 0 and g1 == 5 and g2 == 5
    # Turn 2 re-sends turn 1 (prompt + answer): at least turn 1's prompt is served from cache.
    assert p2 > p1 and c2 >= p1 - 1
    # After /reset the conversation restarts, but the system prompt is still cached.
    assert 0 < c3 < p3


def test_generate_streams_to_stdout(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["generate", "Say hi", "--chat", "--model", str(model_dir), "--max-tokens", "4"]
    assert main([*args, "--ignore-eos", *SMALL]) == 0
    captured = capsys.readouterr()
    assert captured.out.endswith("\n") and captured.out.strip()
    assert re.search(r"\[prompt \d+ tokens, cached 0 \(0%\), generated 4,", captured.err)


def test_demo_shows_cache_hits(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--model", str(model_dir), "--max-tokens", "3", *SMALL]) == 0
    out = capsys.readouterr().out
    found = re.findall(r"prompt (\d+) tokens, (\d+) served from the radix cache", out)
    cached = [int(c) for _, c in found]
    assert len(cached) == 3 and cached[0] == 0 and min(cached[1:]) > 100
    assert "Token hit rate so far:" in out
    url = re.search(r"Live dashboard \(open it in a browser\): (http://\S+/dashboard)\n", out)
    assert url is not None and url.group(1).startswith("http://127.0.0.1:")


def test_serve_flags_parse() -> None:
    args = build_parser().parse_args(
        ["serve", "--port", "9001", "--api-key", "k", "--page-size", "16", "--disable-radix-cache"]
    )
    assert (args.host, args.port, args.api_key, args.model) == ("127.0.0.1", 9001, "k", None)
    assert args.page_size == 16 and args.disable_radix_cache


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_serve_default_model_subprocess() -> None:
    """`radixkv serve` with no model flag: the embedded SmolLM2-135M-Instruct over HTTP."""
    port = _free_port()
    cmd = [sys.executable, "-m", "radixkv", "serve", "--port", str(port), "--log-level", "warning"]
    # A cold torch.compile of the 30-layer model can outlast the start-up deadline on a busy CI
    # machine; the compiled path is covered by tests/model/test_model_compiled.py and by
    # tests/bench/test_compare.py (whose server compiles the tiny model).
    cmd.append("--no-compile")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        why = wait_healthy(url, proc, 300, 0.5, output=lambda: proc.communicate()[0])
        assert why is None, why
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        assert client.models.list().data[0].id == "SmolLM2-135M-Instruct"
        cached = []
        for _ in range(2):
            r = client.chat.completions.create(
                model="SmolLM2-135M-Instruct",
                messages=[{"role": "user", "content": "What is the capital of France?"}],
                max_tokens=12,
                temperature=0,
            )
            assert "Paris" in (r.choices[0].message.content or "")
            assert r.usage is not None and r.usage.prompt_tokens_details is not None
            cached.append(r.usage.prompt_tokens_details.cached_tokens)
        assert cached[0] == 0 and cached[1] == r.usage.prompt_tokens - 1
    finally:
        proc.terminate()
        proc.wait(30)

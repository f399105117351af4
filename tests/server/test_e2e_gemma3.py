"""`radixkv serve --model gemma3-270m` for real: the embedded Gemma 3 270M behind the HTTP server,
driven by the official `openai` client. A greedy chat answer equals transformers' on the converted
checkpoint, and a conversation that grows well past the 512-token sliding window keeps less KV
than a full-attention cache would: the tree holds FULL KV for every token but SWA KV only where
a window is still needed. Skipped, saying why, when the package is not installed."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import torch
from test_cli import _free_port

from radixkv.bench.serving.server_proc import wait_healthy
from radixkv.model.checkpoints.gemma3_gguf import INSTALL_HINT, package_installed

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not package_installed(),
        reason=f"the Gemma 3 270M package is not installed (`{INSTALL_HINT}`; install.sh --test)",
    ),
]
MODEL = "gemma3-270m"
SWA_SLOTS = 1024  # the least the pool accepts is window + one chunk + 2 pages = 800
SERVE = ["--dtype", "float32", "--page-size", "16", "--num-slots", "16384"]
SERVE += ["--swa-slots", str(SWA_SLOTS), "--chunked-prefill-size", "256", "--threads", "1"]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "radixkv", "serve", "--model", MODEL, *SERVE]
    cmd += ["--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        # 600 s: converts on first use when install.sh did not
        why = wait_healthy(base, proc, 600, 0.5, output=lambda: proc.communicate()[0])
        assert why is None, why
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)


def test_chat_completion_equals_transformers(url: str) -> None:
    from transformers import AutoModelForCausalLM

    from radixkv.model.checkpoints.embedded import resolve_model
    from radixkv.model.tokenizer import Tokenizer

    messages: list[Any] = [{"role": "user", "content": "Name the capital of France."}]
    r = _client(url).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=24, temperature=0, logprobs=True
    )
    assert r.model == MODEL and r.usage is not None
    path = resolve_model(MODEL)
    ids = Tokenizer.from_pretrained(path).apply_chat_template(messages)
    assert r.usage.prompt_tokens == len(ids)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)
    want = out[0, len(ids) :].tolist()
    assert r.choices[0].logprobs is not None and r.choices[0].logprobs.content is not None
    assert len(r.choices[0].logprobs.content) == len(want) - (want[-1] in (1, 106))
    tok = Tokenizer.from_pretrained(path)
    assert r.choices[0].message.content == tok.decode(want)


def kv_bytes_kept(stats: dict[str, Any], dtype_bytes: int = 4) -> tuple[int, int]:
    """(KV bytes the tree keeps, bytes a full-attention cache would keep for the same tokens)
    for Gemma 3 270M: 3 global and 15 sliding layers, 1 KV head of 256 per layer."""
    per_layer_token = 2 * 1 * 256 * dtype_bytes  # K and V
    pools = stats["component_pools"]
    full, swa = pools["full"]["cached"], pools["swa"]["cached"]
    return per_layer_token * (3 * full + 15 * swa), per_layer_token * 18 * full


def test_long_conversation_keeps_swa_kv_only_for_the_window(url: str) -> None:
    client = _client(url)
    topics = ("rivers", "bridges", "lanterns", "orchards", "harbors", "meadows", "towers", "roads")
    messages: list[Any] = [{"role": "system", "content": "You answer in one short sentence."}]
    cached = []
    for i, topic in enumerate(topics):
        facts = " ".join(
            f"Fact {j}: the {topic} of town {j} are {j * 3 % 7} miles." for j in range(20)
        )
        messages.append({"role": "user", "content": f"{facts} Which town is nearest? ({i})"})
        r = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=8, temperature=0
        )
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        cached.append(r.usage.prompt_tokens_details.cached_tokens or 0)
        messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})
    stats = httpx.get(url + "/cache/stats", timeout=60).json()
    assert stats["memory_check"] == "ok"
    prompt = r.usage.prompt_tokens
    assert prompt > 4 * 512 and min(cached[1:]) > 0  # every later turn reuses the earlier ones
    assert cached[-1] > prompt - 400  # the whole history but the new turn, far past the window
    kept, full_kv = kv_bytes_kept(stats)
    pools = stats["component_pools"]
    print(
        f"\nconversation {prompt} tokens; tree keeps FULL {pools['full']['cached']} slots, "
        f"SWA {pools['swa']['cached']} slots: {kept / 2**20:.1f} MiB of KV vs "
        f"{full_kv / 2**20:.1f} MiB full KV ({kept / full_kv:.1%})"
    )
    assert pools["swa"]["cached"] <= SWA_SLOTS < pools["full"]["cached"]
    assert kept < 0.5 * full_kv


def test_text_completion_starts_with_bos(url: str) -> None:
    """As in vLLM and transformers, a text prompt to /v1/completions gets Gemma's <bos> (without
    it Gemma's answers are garbage); `add_special_tokens: false` and token-id prompts are taken
    as they are."""
    body = {"model": MODEL, "prompt": "The capital of France is"}
    render = url + "/v1/completions/render"
    ids = httpx.post(render, json=body, timeout=60).json()[0]["token_ids"]
    off = {**body, "add_special_tokens": False}
    raw = httpx.post(render, json=off, timeout=60).json()[0]["token_ids"]
    assert ids[0] == 2 and ids[1:] == raw and raw[0] != 2
    r = _client(url).completions.create(model=MODEL, prompt=body["prompt"], max_tokens=2)
    assert r.usage is not None and r.usage.prompt_tokens == len(ids)

"""End to end: `radixkv serve` (a subprocess) over a tiny Gemma 3 checkpoint (sliding window +
full attention) with L2 and the file L3 backend, driven by the official `openai` client; after a
graceful restart the new server gets a 1,500-token prompt back from L3, and the answer equals a
cache-off engine's in float32."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import openai
import pytest
import torch

from radixkv.bench.serving.server_proc import wait_healthy
from radixkv.engine.engine import Engine
from radixkv.engine.types import SamplingParams

pytest.importorskip("radixkv.model.families.gemma3")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(model: Path, l3: Path, port: int) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "radixkv", "serve", "--model", str(model), "--port", str(port)]
    cmd += ["--dtype", "float32", "--page-size", "16", "--num-slots", "4096"]
    cmd += ["--max-model-len", "2048", "--log-level", "warning", "--threads", "1"]
    cmd += ["--enable-hierarchical-cache", "--hicache-storage-backend", "file"]
    cmd += ["--hicache-storage-url", str(l3)]
    # A fresh server holds a request for its L3 pages at most --hicache-prefetch-timeout (2 s by
    # default): a loaded machine's fetch can run past it, and the prompt is then recomputed.
    # Restoring is what is tested here, not how fast: these bound a hang, not a speed.
    cmd += ["--hicache-prefetch-timeout", "60", "--hicache-flush-timeout", "25"]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def _complete(
    proc: subprocess.Popen[str], port: int, model: str, prompt: list[int]
) -> tuple[str, int]:
    url = f"http://127.0.0.1:{port}"
    why = wait_healthy(url, proc, 300, 0.2, output=lambda: proc.communicate()[0])
    assert why is None, why
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    r = client.completions.create(
        model=model, prompt=prompt, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    return r.choices[0].text, int(r.usage.prompt_tokens_details.cached_tokens or 0)


def _stop(proc: subprocess.Popen[str]) -> None:
    """A graceful shutdown (SIGTERM): the engine flushes its pending L3 writes."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    finally:
        proc.kill()
        proc.wait(30)


@pytest.mark.slow
def test_restarted_gemma3_server_restores_from_file_storage(
    tiny_model_dir: Callable[..., Path], tmp_path: Path
) -> None:
    path = tiny_model_dir("gemma3", max_position_embeddings=2048)
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, 1000, (1500,), generator=g).tolist()
    off = Engine(str(path), device="cpu", dtype="float32", page_size=16, disable_radix_cache=True)
    sp = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    want = off.generate([prompt], sp)[0].text
    texts, cached = [], []
    for _ in range(2):  # the second server starts on the first one's L3 directory
        port = _free_port()
        proc = _serve(path, tmp_path / "l3", port)
        try:
            text, hit = _complete(proc, port, path.name, prompt)
        finally:
            _stop(proc)
        texts.append(text)
        cached.append(hit)
    assert texts == [want, want]
    assert cached[0] == 0 and cached[1] >= 0.9 * len(prompt), cached

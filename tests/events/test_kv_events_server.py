"""KV events end to end: a real `radixkv serve` process (tiny model, page 16) driven by the official
`openai` client, and a Python subscriber (SUB + DEALER replay) decoding what it publishes.

The server's PUB connects to the subscriber's bound loopback port (vLLM's rule: a non-wildcard
endpoint is connected to), its replay ROUTER binds on loopback. Checked: start-up clear; the
first request's prompt announced as its whole blocks (ids chained, token ids = the rendered
prompt); a salted request gets its own ids; evictions arrive as removals of announced blocks;
`POST /flush_cache` arrives as AllBlocksCleared; a subscriber that joins late rebuilds the same
table from the replay socket alone; a malformed flag stops the server at start-up.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from kv_subscriber import Subscriber, free_port

from radixkv.bench.serving.server_proc import wait_healthy

MODEL = "tiny-llama"
BS = 16


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    log = tmp_path_factory.mktemp("events") / "server.log"
    pub, rep, port = free_port(), free_port(), free_port()
    sub = Subscriber(f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{rep}", b"kv", bind=True)
    cfg = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{pub}",
        "replay_endpoint": f"tcp://127.0.0.1:{rep}",
        "topic": "kv",
    }
    cmd = [sys.executable, "-m", "radixkv", "serve", "--model", str(tiny_model_dir("llama"))]
    cmd += ["--served-model-name", MODEL, "--port", str(port), "--page-size", str(BS)]
    cmd += ["--num-slots", "1024", "--max-model-len", "512", "--no-compile", "--threads", "1"]
    cmd += ["--log-level", "warning", "--kv-events-config", json.dumps(cfg)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        # 300 s: a cold start may build the CPU kernels first
        why = wait_healthy(url, proc, 300, 0.2)
        assert why is None, f"{why}: {log.read_text()[-3000:]}"
        yield {"url": url, "sub": sub, "replay": sub.replay_endpoint}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        sub.close()


def _prompt(i: int) -> str:
    return f"Tenant {i} system prompt. " + " ".join(f"rule {i}.{k} applies" for k in range(40))


def _ids(url: str, prompt: str) -> list[int]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
    return list(
        httpx.post(url + "/v1/completions/render", json=body, timeout=30).json()[0]["token_ids"]
    )


def _blocks_of(ids: list[int], salt: str | None) -> set[tuple[str | None, tuple[int, ...]]]:
    return {(salt, tuple(ids[:e])) for e in range(BS, len(ids) + 1, BS)}


@pytest.mark.slow
def test_events_through_the_server(server: dict[str, Any]) -> None:
    url, sub = server["url"], server["sub"]
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)

    def ask(prompt: str, salt: str | None = None) -> None:
        extra = {"ignore_eos": True} | ({"cache_salt": salt} if salt else {})
        r = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=4, temperature=0.0, extra_body=extra
        )
        assert r.choices[0].finish_reason == "length"

    sub.drain()  # the start-up clear (replayed if the connection came after it)
    assert sub.batches[0][1][1] == [{"type": "AllBlocksCleared"}]

    first = _ids(url, _prompt(0))
    assert len(first) > 5 * BS
    ask(_prompt(0))
    sub.drain()
    assert _blocks_of(first, None) <= sub.prefixes()  # every whole block of the prompt

    ask(_prompt(0), salt="tenant-a")
    sub.drain()
    salted = {h for h, b in sub.blocks.items() if b.salt == "tenant-a"}
    plain = {h for h, b in sub.blocks.items() if b.salt is None}
    assert _blocks_of(first, "tenant-a") <= sub.prefixes() and salted and not salted & plain

    for i in range(1, 8):  # 8 prompts of ~300 tokens through a 1024-token pool: evictions
        ask(_prompt(i))
    sub.drain()
    removed = [e for _, (_, evs, _) in sub.batches for e in evs if e["type"] == "BlockRemoved"]
    assert removed and all(e["medium"] == "GPU" for e in removed)
    assert not _blocks_of(first, None) <= sub.prefixes()  # the oldest prompt was evicted
    assert len(sub.blocks) * BS <= 1024

    # A subscriber that missed everything rebuilds the same table from the replay socket.
    late = Subscriber(f"tcp://127.0.0.1:{free_port()}", server["replay"], b"kv", bind=True)
    try:
        late.replay(0)
        assert late.next_seq == sub.next_seq and late.prefixes() == sub.prefixes()
    finally:
        late.close()

    assert httpx.post(url + "/flush_cache", timeout=30).status_code == 200
    sub.drain()
    assert sub.blocks == {} and sub.batches[-1][1][1][-1] == {"type": "AllBlocksCleared"}
    ask(_prompt(0))
    sub.drain()
    assert _blocks_of(first, None) <= sub.prefixes()


def test_malformed_config_is_a_startup_error() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "radixkv",
            "serve",
            "--kv-events-config",
            '{"enable_kv_cache_events"',
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "--kv-events-config" in done.stderr and "not valid JSON" in done.stderr

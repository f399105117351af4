"""32k-token agent sessions on the seeded long-context Llama (`tiny-32k`: Llama 3's rope scaling
at 32,768 positions) through a real `radixkv serve`: a turn after a cached 30k-token history
prefills only its new tokens (cached = the common prefix rounded down to a page), a 30k prompt is
prefilled in chunks, and several such sessions on a pool smaller than their sum are all answered
while eviction keeps the pool's accounting whole."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from radixkv.bench.agent.agent_probe import history
from radixkv.bench.inputs.tokens import load_tokenizer
from radixkv.bench.serving.server_proc import LocalServer
from radixkv.bench.tiny_model import TINY_32K, seeded_llama

pytestmark = pytest.mark.slow

PAGE = 16
HISTORY = 30000
CHUNK = 2048  # the server's default --chunked-prefill-size


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = seeded_llama(TINY_32K, tmp_path_factory.mktemp("tiny32k") / "ckpt")
    assert json.loads((path / "config.json").read_text())["max_position_embeddings"] == 32768
    return path


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=900) as r:
        out: dict[str, Any] = json.loads(r.read())
        return out


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=60) as r:
        out: dict[str, Any] = json.loads(r.read())
        return out


class Chat:
    def __init__(self, url: str) -> None:
        self.url = url
        self.model = _get(url + "/v1/models")["data"][0]["id"]

    def body(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        return {"model": self.model, "messages": messages, "max_tokens": 1, "ignore_eos": True}

    def send(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        return _post(self.url + "/v1/chat/completions", self.body(messages))

    def ids(self, messages: list[dict[str, Any]]) -> list[int]:
        return list(
            _post(self.url + "/v1/chat/completions/render", self.body(messages))["token_ids"]
        )

    def stats(self) -> dict[str, Any]:
        return _get(self.url + "/cache/stats")


@pytest.fixture
def server(model: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Chat]:
    flags = ["--dtype", "float32", "--page-size", str(PAGE), *getattr(request, "param", [])]
    with LocalServer(str(model), flags, tmp_path / "server.log", startup_timeout=600) as srv:
        yield Chat(srv.url)


def _count(model: Path) -> Any:
    tok = load_tokenizer(model)
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def test_a_turn_after_a_cached_32k_history_prefills_only_its_new_tokens(
    server: Chat, model: Path
) -> None:
    hist = history(_count(model), HISTORY, seed=0)
    first = [*hist, {"role": "user", "content": "Go."}]
    steps0 = server.stats()["engine"]["steps"]
    a = server.send(first)["usage"]
    assert a["prompt_tokens"] >= HISTORY - 200 and a["prompt_tokens_details"]["cached_tokens"] == 0
    # Chunked prefill: a 30k prompt takes one step per chunk at least.
    assert server.stats()["engine"]["steps"] - steps0 >= a["prompt_tokens"] // CHUNK
    second = [*hist, {"role": "user", "content": "Now the next step: " + "check it. " * 40}]
    before = server.stats()["prefill_tokens_total"]
    b = server.send(second)["usage"]
    ids_a, ids_b = server.ids(first), server.ids(second)
    assert len(ids_b) == b["prompt_tokens"]
    common = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=False)) if x != y)
    cached = b["prompt_tokens_details"]["cached_tokens"]
    assert cached == common // PAGE * PAGE and cached >= HISTORY - 200
    new = b["prompt_tokens"] - cached
    assert new < 200 + PAGE
    assert server.stats()["prefill_tokens_total"] - before == new


@pytest.mark.parametrize("server", [["--num-slots", "65536"]], indirect=True)
def test_several_32k_sessions_on_a_smaller_pool_are_all_answered(server: Chat, model: Path) -> None:
    count = _count(model)
    sessions = [history(count, HISTORY, seed=s) for s in range(3)]  # 3 x 30k > the 64k pool

    def turn(k: int) -> Any:
        def go(hist: list[dict[str, Any]]) -> dict[str, Any]:
            msgs = [*hist, {"role": "user", "content": f"Turn {k}."}]
            return dict(server.send(msgs)["usage"])

        with ThreadPoolExecutor(len(sessions)) as pool:
            return list(pool.map(go, sessions))

    first, second = turn(1), turn(2)
    for u in (*first, *second):
        assert u["prompt_tokens"] >= HISTORY - 200 and u["completion_tokens"] == 1
    cached = [u["prompt_tokens_details"]["cached_tokens"] for u in second]
    # The pool cannot have kept every history: eviction ran, and what was hit fit in the pool.
    assert sum(cached) <= 65536 and min(cached) < HISTORY - 200
    assert _get(server.url + "/health")["status"] == "ok"
    stats = server.stats()
    assert stats["memory_check"] == "ok", stats["memory_check"]
    pool = stats["component_pools"]["full"]
    assert pool["held"] == 0 and pool["free"] + pool["cached"] == pool["size"] == 65536
    assert stats["running_requests"] == 0 and stats["waiting_requests"] == 0
    # Still serving after the pressure: a session's history, cached (again) by one turn, is hit
    # by the next.
    server.send([*sessions[0], {"role": "user", "content": "Turn 3."}])
    again = server.send([*sessions[0], {"role": "user", "content": "Turn 4."}])["usage"]
    assert again["prompt_tokens_details"]["cached_tokens"] >= HISTORY - 200

"""End-to-end on the real engine: concurrent clients are batched without changing outputs, page
size 16 keeps the census exact under disconnects, and overload is a clean 503."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_harness import live_server

from radixkv.engine.engine import Engine
from radixkv.engine.types import EngineConfig

MODEL = "tiny"
PREFIX = "A shared instruction block that every request repeats before its own question. " * 3


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir: Callable[..., Path]) -> Path:
    return tiny_model_dir("llama")


def _engine(path: Path, **cfg: Any) -> Engine:
    base = {"num_slots": 4096, "max_model_len": 512, "seed": 0}
    return Engine(str(path), EngineConfig(**{**base, **cfg}))


async def _run_all(url: str, prompts: list[str], **kw: Any) -> list[tuple[str, int]]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)

    async def one(p: str) -> tuple[str, int]:
        r = await client.completions.create(model=MODEL, prompt=p, **kw)
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        return r.choices[0].text, r.usage.prompt_tokens_details.cached_tokens

    try:
        return list(await asyncio.gather(*(one(p) for p in prompts)))
    finally:
        await client.close()


@pytest.mark.parametrize("page_size", [1, 16])
def test_concurrent_requests_match_sequential_cache_off(model_dir: Path, page_size: int) -> None:
    prompts = [PREFIX + f"Question number {i}: what comes next?" for i in range(8)]
    kw: dict[str, Any] = {"max_tokens": 6, "temperature": 0, "extra_body": {"ignore_eos": True}}
    with live_server(_engine(model_dir, disable_radix_cache=True), MODEL) as off:
        expected = [asyncio.run(_run_all(off.url, [p], **kw))[0][0] for p in prompts]
    with live_server(_engine(model_dir, page_size=page_size), MODEL) as on:
        warm = asyncio.run(_run_all(on.url, prompts[:1], **kw))  # puts the prefix in the tree
        results = asyncio.run(_run_all(on.url, prompts[1:], **kw))
        stats = httpx.get(on.url + "/cache/stats").json()
    assert [t for t, _ in warm + results] == expected
    assert all(c > 0 and c % page_size == 0 for _, c in results), results
    assert stats["memory_check"] == "ok" and stats["config"]["page_size"] == page_size


def test_disconnects_at_page_size_16(model_dir: Path) -> None:
    with live_server(_engine(model_dir, page_size=16), MODEL) as srv:
        body = {"prompt": PREFIX, "max_tokens": 300, "stream": True, "ignore_eos": True}
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            streams = [client.stream("POST", "/v1/completions", json=body) for _ in range(8)]
            for i, s in enumerate(streams):
                resp = s.__enter__()
                assert resp.status_code == 200
                lines = resp.iter_lines()
                for _ in range(i % 4):  # hang up after 0..3 events
                    next(lines)
            for s in streams:
                s.__exit__(None, None, None)
        deadline = time.monotonic() + 30
        while (stats := httpx.get(srv.url + "/cache/stats").json())["inflight_requests"] or (
            stats["running_requests"] or stats["waiting_requests"]
        ):
            assert time.monotonic() < deadline, stats
            time.sleep(0.05)
        assert stats["memory_check"] == "ok"
        flushed = httpx.post(srv.url + "/flush_cache").json()
        assert flushed["free_slots"] == flushed["pool_slots"]


def test_overload_real_engine_is_503(model_dir: Path) -> None:
    eng = _engine(model_dir, max_running_requests=1, max_queued_requests=1)
    with live_server(eng, MODEL) as srv:
        body = {"prompt": "hold", "max_tokens": 400, "stream": True, "ignore_eos": True}
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            streams = [client.stream("POST", "/v1/completions", json=body) for _ in range(2)]
            try:
                assert all(s.__enter__().status_code == 200 for s in streams)
                refused = client.post("/v1/completions", json={**body, "stream": False})
                assert refused.status_code == 503
                assert refused.json()["error"]["code"] == "overloaded"
            finally:
                for s in streams:
                    s.__exit__(None, None, None)
        ok = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200

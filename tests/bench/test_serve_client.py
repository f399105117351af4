"""The serving client against a fake streaming server on 127.0.0.1 with known injected delays."""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from radixkv.bench import serve
from radixkv.bench.client import ClientOptions, run_requests
from radixkv.bench.metrics import format_summary, summarize
from radixkv.bench.workloads import BenchRequest

FIRST_DELAY = 0.30  # before the first token
TOKEN_DELAY = 0.05  # between tokens
ERROR_MAX_TOKENS = 13  # the fake server answers 500 to this max_tokens


class FakeServer:
    """Streams `max_tokens` one-token chunks; cached_tokens = half the prompt (floored)."""

    def __init__(self) -> None:
        self.log: list[dict[str, Any]] = []  # per request: first prompt id, arrival, done times
        self.flushes = 0
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        entry = {"key": body["prompt"][:2], "arrive": time.perf_counter(), "body": body}
        self.log.append(entry)
        n = int(body["max_tokens"])
        if n == ERROR_MAX_TOKENS:
            return web.json_response({"error": {"message": "boom"}}, status=500)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)  # headers go out immediately: TTFT must not count them
        await asyncio.sleep(FIRST_DELAY)
        for i in range(n):
            if i:
                await asyncio.sleep(TOKEN_DELAY)
            chunk = {"choices": [{"index": 0, "text": "x", "finish_reason": None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        prompt = len(body["prompt"])
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": n,
            "total_tokens": prompt + n,
            "prompt_tokens_details": {"cached_tokens": prompt // 2},
        }
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        entry["done"] = time.perf_counter()
        return resp

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "fake-model", "object": "model"}]})

    async def flush(self, request: web.Request) -> web.Response:
        self.flushes += 1
        return web.json_response({"ok": True})

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/flush_cache", self.flush)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    def __enter__(self) -> FakeServer:
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._runner is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as s:
        yield s


def req(
    i: int, n_prompt: int, max_tokens: int, parent: int | None = None, **kw: Any
) -> BenchRequest:
    return BenchRequest(i, [100 + i] * n_prompt, max_tokens, f"g{i}", parent=parent, **kw)


def test_ttft_tpot_e2e_and_usage(server: FakeServer) -> None:
    reqs = [req(0, 10, 6), req(1, 7, 6), req(2, 4, ERROR_MAX_TOKENS), req(3, 9, 1)]
    run = asyncio.run(run_requests(reqs, ClientOptions(server.url, "m", concurrency=4)))
    ok = {r.index: r for r in run.results if r.ok}
    assert sorted(ok) == [0, 1, 3]
    bad = [r for r in run.results if not r.ok]
    assert len(bad) == 1 and bad[0].error is not None and "500" in bad[0].error
    for i in (0, 1):
        r = ok[i]
        assert r.ttft_s is not None and r.tpot_s is not None and r.e2e_s is not None
        assert FIRST_DELAY <= r.ttft_s < FIRST_DELAY + 0.15
        assert TOKEN_DELAY * 0.9 <= r.tpot_s < TOKEN_DELAY + 0.025
        assert FIRST_DELAY + 5 * TOKEN_DELAY <= r.e2e_s < FIRST_DELAY + 5 * TOKEN_DELAY + 0.25
        assert r.output_tokens == 6 and r.usage_reported
    assert ok[3].tpot_s is None and ok[3].output_tokens == 1  # one token: no TPOT
    assert (ok[0].prompt_tokens, ok[0].cached_tokens) == (10, 5)
    s = summarize(run.results, run.wall_s, ideal_hit_rate=0.25)
    assert s["completed"] == 3 and s["errors"] == 1
    assert s["token_hit_rate"] == pytest.approx((5 + 3 + 4) / (10 + 7 + 9))
    assert s["output_tokens"] == 13
    assert s["output_tok_per_s"] == pytest.approx(13 / run.wall_s)
    assert s["input_tok_per_s"] == pytest.approx(26 / run.wall_s)
    assert FIRST_DELAY <= s["ttft_s"]["p50"] < FIRST_DELAY + 0.15
    assert "25.0%" in format_summary(s)


def test_closed_loop_waits_for_the_parent(server: FakeServer) -> None:
    reqs = [req(0, 3, 2), req(1, 3, 2, parent=0), req(2, 3, 2, parent=1), req(3, 3, 2)]
    run = asyncio.run(run_requests(reqs, ClientOptions(server.url, "m", concurrency=8)))
    assert all(r.ok for r in run.results)
    by_key = {tuple(e["key"]): e for e in server.log}
    for child, parent in ((1, 0), (2, 1)):
        assert by_key[(100 + child,) * 2]["arrive"] >= by_key[(100 + parent,) * 2]["done"]
    # the independent request is not held back behind the chain
    assert by_key[(103, 103)]["arrive"] < by_key[(100, 100)]["done"]


def test_arrival_times_and_duration_limit(server: FakeServer) -> None:
    reqs = [req(0, 3, 1, arrival_s=0.0), req(1, 3, 1, arrival_s=0.4), req(2, 3, 1, arrival_s=5.0)]
    opts = ClientOptions(server.url, "m", use_arrival_times=True, duration_limit=1.5)
    run = asyncio.run(run_requests(reqs, opts))
    sends = {r.index: r.send_s for r in run.results}
    assert sorted(sends) == [0, 1] and run.not_sent == 1
    assert sends[0] < 0.1 and 0.4 <= sends[1] < 0.55


def test_bench_serve_cli_writes_json(server: FakeServer, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    argv = ["serve", "--base-url", server.url, "--workload", "shared-prefix"]
    argv += ["--num-groups", "2", "--prompts-per-group", "2", "--system-len", "8"]
    argv += ["--question-len", "4", "--output-len", "2", "--warmup", "1", "--no-progress"]
    argv += ["--json", str(out)]
    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    data = json.loads(out.read_text())
    assert data["model"] == "fake-model" and data["flushed_after_warmup"] is True
    assert server.flushes == 1 and len(server.log) == 5  # 1 warm-up + 4 measured
    s = data["summary"]
    assert s["completed"] == 4 and s["errors"] == 0
    assert s["ideal_hit_rate"] == pytest.approx(2 * 8 / (4 * 12), abs=0.05)
    assert s["token_hit_rate"] == pytest.approx(0.5)
    assert len(data["requests"]) == 4 and data["workload"]["num_requests"] == 4
    assert all(e["body"]["stream"] and e["body"]["ignore_eos"] for e in server.log)

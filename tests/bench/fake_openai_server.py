"""A fake OpenAI-compatible streaming server with known injected delays (bench tests)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

from aiohttp import web

FIRST_DELAY = 0.30  # before the first token
TOKEN_DELAY = 0.05  # between tokens
ERROR_MAX_TOKENS = 13  # the fake server answers 500 to this max_tokens
# What its GET /config reports as `resolved.kernel_paths`, as a RadixKV server does.
KERNEL_PATHS = {"cpu": "Fake CPU 9000", "kernels": "fake", "float32_gemm": "fma"}


class FakeServer:
    """Streams `max_tokens` one-token chunks; cached_tokens = half the prompt (floored)."""

    def __init__(self, first_delay: float = FIRST_DELAY) -> None:
        self.first_delay = first_delay
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
        await asyncio.sleep(self.first_delay)
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

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "fake-1.0"})

    async def config(self, request: web.Request) -> web.Response:
        return web.json_response({"resolved": {"kernel_paths": KERNEL_PATHS}})

    async def flush(self, request: web.Request) -> web.Response:
        self.flushes += 1
        return web.json_response({"ok": True})

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/version", self.version)
        app.router.add_get("/config", self.config)
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

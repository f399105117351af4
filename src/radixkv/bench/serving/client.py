"""An async streaming client for OpenAI-compatible /v1/completions, timing every request.

Per request: TTFT = send → first chunk carrying output text; E2E = send → end of stream;
TPOT = (E2E − TTFT) / (output tokens − 1); output, prompt and cached tokens come from the final
`usage` (streamed with `stream_options.include_usage`), falling back to counting text chunks when
a server sends no usage. Errors (HTTP status, broken stream, timeout) are recorded, never raised.

Scheduling: requests are dispatched in workload order, a request only once its `parent` finished
(closed loop), optionally paced by Poisson arrivals at `request_rate` (seeded) or by the trace's own
`arrival_s` offsets, and capped at `concurrency` in flight. After `duration_limit` seconds nothing
new is sent; requests already in flight run to completion.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp
import numpy as np

from radixkv.bench.inputs.workloads import BenchRequest


@dataclass
class RequestResult:
    index: int
    group: str
    ok: bool
    error: str | None = None
    send_s: float = 0.0  # offset from the start of the run
    ttft_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None
    prompt_tokens: int = 0  # as reported by the server (or the ids we sent)
    cached_tokens: int = 0
    output_tokens: int = 0
    usage_reported: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RunResult:
    results: list[RequestResult]
    wall_s: float
    not_sent: int  # requests never dispatched (duration limit)


@dataclass(frozen=True)
class ClientOptions:
    base_url: str
    model: str
    api_key: str | None = None
    request_rate: float = math.inf  # requests/s (Poisson); inf → no pacing
    concurrency: int | None = None  # max in flight; None → unbounded
    use_arrival_times: bool = False  # pace by BenchRequest.arrival_s (trace replay)
    duration_limit: float | None = None  # seconds
    seed: int = 0
    request_timeout: float = 3600.0
    temperature: float = 0.0
    extra_body: tuple[tuple[str, Any], ...] = ()


def _payload(req: BenchRequest, opts: ClientOptions) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": opts.model,
        "prompt": req.prompt_text if req.prompt_text is not None else req.prompt_ids,
        "max_tokens": req.max_tokens,
        "temperature": opts.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,  # every request produces exactly max_tokens (vLLM/SGLang/ours)
    }
    body.update(dict(opts.extra_body))
    return body


def _apply_usage(res: RequestResult, usage: dict[str, Any]) -> None:
    res.usage_reported = True
    res.prompt_tokens = int(usage.get("prompt_tokens") or res.prompt_tokens)
    res.output_tokens = int(usage.get("completion_tokens") or res.output_tokens)
    details = usage.get("prompt_tokens_details") or {}
    res.cached_tokens = int(details.get("cached_tokens") or 0)


async def send_request(
    session: aiohttp.ClientSession, req: BenchRequest, opts: ClientOptions, t0: float
) -> RequestResult:
    """Stream one completion and time it; never raises (except on cancellation)."""
    res = RequestResult(index=req.index, group=req.group, ok=False)
    res.prompt_tokens = len(req.prompt_ids)
    headers = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
    url = opts.base_url.rstrip("/") + "/v1/completions"
    start = time.perf_counter()
    res.send_s = start - t0
    chunks = 0
    try:
        async with session.post(url, json=_payload(req, opts), headers=headers) as resp:
            if resp.status != 200:
                text = (await resp.text())[:300]
                res.error = f"HTTP {resp.status}: {text}"
                return res
            async for raw in resp.content:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = f"stream error: {json.dumps(chunk['error'])[:300]}"
                    return res
                for choice in chunk.get("choices") or []:
                    if choice.get("text"):
                        chunks += 1
                        if res.ttft_s is None:
                            res.ttft_s = time.perf_counter() - start
                if chunk.get("usage"):
                    _apply_usage(res, chunk["usage"])
        end = time.perf_counter()
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError, ValueError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"[:300]
        return res
    res.e2e_s = end - start
    if not res.usage_reported:
        res.output_tokens = chunks
    if res.ttft_s is None:  # no visible text at all (e.g. only whitespace-free empty deltas)
        res.ttft_s = res.e2e_s
    if res.output_tokens > 1:
        res.tpot_s = (res.e2e_s - res.ttft_s) / (res.output_tokens - 1)
    res.ok = True
    return res


class _ReadyQueue:
    """Requests whose parent has finished, in workload order; closed at the duration limit."""

    def __init__(self, requests: Sequence[BenchRequest]) -> None:
        self.ready: deque[BenchRequest] = deque(r for r in requests if r.parent is None)
        self.children: dict[int, list[BenchRequest]] = defaultdict(list)
        for r in requests:
            if r.parent is not None:
                if not 0 <= r.parent < r.index:
                    raise ValueError(f"request {r.index}: parent must be an earlier request")
                self.children[r.parent].append(r)
        self.unsent = len(requests)
        self.closed = False
        self.cond = asyncio.Condition()

    async def take(self) -> BenchRequest | None:
        async with self.cond:
            # Invariant: while unsent > 0 and nothing is ready, some parent is still in flight.
            while not self.ready and self.unsent and not self.closed:
                await self.cond.wait()
            if self.closed or not self.ready:
                return None
            self.unsent -= 1
            return self.ready.popleft()

    async def finished(self, req: BenchRequest) -> None:
        async with self.cond:
            self.ready.extend(self.children.pop(req.index, []))
            self.cond.notify_all()

    async def close(self) -> None:
        async with self.cond:
            self.closed = True
            self.cond.notify_all()


async def run_requests(
    requests: Sequence[BenchRequest], opts: ClientOptions, progress: Any | None = None
) -> RunResult:
    """Run `requests` against the server under the scheduling in `opts` (see module doc)."""
    queue = _ReadyQueue(requests)
    rng = np.random.default_rng(opts.seed)
    sem = asyncio.Semaphore(opts.concurrency) if opts.concurrency else None
    results: list[RequestResult] = []
    tasks: list[asyncio.Task[None]] = []
    timeout = aiohttp.ClientTimeout(total=opts.request_timeout)
    connector = aiohttp.TCPConnector(limit=0)
    t0 = time.perf_counter()

    async def one(session: aiohttp.ClientSession, req: BenchRequest) -> None:
        try:
            res = await send_request(session, req, opts, t0)
            results.append(res)
            if progress is not None:
                progress.update(1)
        finally:
            if sem is not None:
                sem.release()
            await queue.finished(req)

    async def deadline() -> None:
        assert opts.duration_limit is not None
        await asyncio.sleep(opts.duration_limit)
        await queue.close()

    timer = asyncio.create_task(deadline()) if opts.duration_limit else None
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        next_at = 0.0
        while True:
            if sem is not None:
                await sem.acquire()
            req = await queue.take()
            if req is None:
                if sem is not None:
                    sem.release()
                break
            if opts.use_arrival_times and req.arrival_s is not None:
                next_at = req.arrival_s
            elif math.isfinite(opts.request_rate):
                next_at += float(rng.exponential(1.0 / opts.request_rate))
            if opts.duration_limit is not None and next_at >= opts.duration_limit:
                break
            delay = t0 + next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(session, req)))
        await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    if timer is not None:
        timer.cancel()
    results.sort(key=lambda r: r.index)
    return RunResult(results=results, wall_s=wall, not_sent=len(requests) - len(results))

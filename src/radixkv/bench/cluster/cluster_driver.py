"""Send a workload through a router to N replicas and find out which replica served each request.

The client side is `radixkv.bench.serving.client.send_request` (streamed /v1/completions, TTFT from
the first text chunk, `usage.prompt_tokens_details.cached_tokens`). Each request carries a unique
`session_id` (a RadixKV extension that only keeps per-session statistics; routers pass unknown
body fields through), so afterwards exactly one replica answers `GET /sessions/{id}`: that is the
replica that served it. Each replica's `GET /cache/stats` before and after the run gives its own
counters (requests finished, prompt and cached tokens, cached tokens per tier), which must add up
to what the clients saw.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from radixkv.bench.inputs.workloads import BenchRequest
from radixkv.bench.serving.client import ClientOptions, RequestResult, send_request
from radixkv.engine.tiers.prefetch import REASONS

# Counters of /cache/stats whose difference over a run is a replica's load.
_COUNTERS = ("finished_requests", "prompt_tokens_total", "cached_prompt_tokens_total")
_PREFETCH_COUNTERS = (
    "prefetch_waited",
    "prefetch_skipped",
    "prefetch_timed_out",
    "host_saved_pages",
    "host_save_dropped_pages",
    *(f"prefetch_decided_{r}" for r in REASONS),
)


@dataclass
class ClusterRun:
    """One workload through one cluster. `replica_of[i]` is the index (in `worker_urls`) of the
    replica that served `results[i]`, None if no replica knew its session (an error)."""

    results: list[RequestResult]
    replica_of: list[int | None]
    replica_stats: list[dict[str, Any]]  # per replica: counter differences over the run
    wall_s: float
    errors: list[str] = field(default_factory=list)

    def per_replica(self, replicas: int) -> list[dict[str, Any]]:
        """Requests, prompt and cached tokens per replica as the clients saw them."""
        rows = [{"requests": 0, "prompt_tokens": 0, "cached_tokens": 0} for _ in range(replicas)]
        for res, r in zip(self.results, self.replica_of, strict=True):
            if r is not None and res.ok:
                rows[r]["requests"] += 1
                rows[r]["prompt_tokens"] += res.prompt_tokens
                rows[r]["cached_tokens"] += res.cached_tokens
        return rows


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def _get_json(
    session: aiohttp.ClientSession, url: str, api_key: str | None
) -> tuple[int, Any]:
    async with session.get(url, headers=_headers(api_key)) as resp:
        body = await resp.json(content_type=None) if resp.status == 200 else None
        return resp.status, body


async def stats_snapshot(
    session: aiohttp.ClientSession, worker_urls: Sequence[str], api_key: str | None
) -> list[dict[str, Any]]:
    """Each replica's cumulative counters (`_COUNTERS` and `cached_tokens_by_tier`)."""
    out = []
    for url in worker_urls:
        status, body = await _get_json(session, url.rstrip("/") + "/cache/stats", api_key)
        if status != 200 or not isinstance(body, dict):
            raise RuntimeError(f"{url}/cache/stats answered {status}")
        snap: dict[str, Any] = {k: int(body.get(k, 0)) for k in _COUNTERS}
        snap["cached_tokens_by_tier"] = dict(body.get("cached_tokens_by_tier") or {})
        tiers = body.get("tier_stats") or {}
        snap["prefetch"] = {k: int(v) for k, v in tiers.items() if k in _PREFETCH_COUNTERS}
        out.append(snap)
    return out


def stats_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What one replica did between two snapshots."""
    out: dict[str, Any] = {k: after[k] - before[k] for k in _COUNTERS}
    tiers_a, tiers_b = after["cached_tokens_by_tier"], before["cached_tokens_by_tier"]
    out["cached_tokens_by_tier"] = {t: n - int(tiers_b.get(t, 0)) for t, n in tiers_a.items()}
    # With an L3: how many requests waited for their storage pages, and why each did or not.
    pre_a, pre_b = after.get("prefetch", {}), before.get("prefetch", {})
    if pre_a:
        out["prefetch"] = {k: n - int(pre_b.get(k, 0)) for k, n in pre_a.items()}
    return out


async def _attribute(
    session: aiohttp.ClientSession,
    worker_urls: Sequence[str],
    tags: Sequence[str],
    api_key: str | None,
) -> list[int | None]:
    """For each session tag, the replica that knows it (None if none does)."""
    sem = asyncio.Semaphore(16)

    async def one(tag: str) -> int | None:
        for r, url in enumerate(worker_urls):
            async with sem:
                status, _ = await _get_json(session, f"{url.rstrip('/')}/sessions/{tag}", api_key)
            if status == 200:
                return r
        return None

    return list(await asyncio.gather(*(one(t) for t in tags)))


async def drive(
    requests: Sequence[BenchRequest],
    opts: ClientOptions,
    worker_urls: Sequence[str],
    *,
    tag: str,
    progress: Any | None = None,
) -> ClusterRun:
    """Send `requests` to `opts.base_url` (the router) at most `opts.concurrency` at a time, in
    order, paced by their `arrival_s` when `opts.use_arrival_times`; then attribute each one."""
    sem = asyncio.Semaphore(opts.concurrency or len(requests) or 1)
    timeout = aiohttp.ClientTimeout(total=opts.request_timeout)
    tags = [f"{tag}-{r.index}" for r in requests]
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        before = await stats_snapshot(session, worker_urls, opts.api_key)
        t0 = time.perf_counter()

        async def one(req: BenchRequest, sid: str) -> RequestResult:
            try:
                mine = dataclasses.replace(opts, extra_body=(*opts.extra_body, ("session_id", sid)))
                return await send_request(session, req, mine, t0)
            finally:
                sem.release()
                if progress is not None:
                    progress.update(1)

        tasks = []
        for req, sid in zip(requests, tags, strict=True):
            await sem.acquire()
            if opts.use_arrival_times and req.arrival_s is not None:
                delay = t0 + req.arrival_s - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(req, sid)))
        results = list(await asyncio.gather(*tasks))
        wall = time.perf_counter() - t0
        after = await stats_snapshot(session, worker_urls, opts.api_key)
        replica_of = await _attribute(session, worker_urls, tags, opts.api_key)
    deltas = [stats_delta(b, a) for b, a in zip(before, after, strict=True)]
    errors = [r.error for r in results if not r.ok and r.error]
    return ClusterRun(results, replica_of, deltas, wall, errors[:5])

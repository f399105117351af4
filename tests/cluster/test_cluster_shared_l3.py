"""The launcher's shared L3: two replicas (no router) given one redis-server the launcher starts;
a prompt computed on replica 0 is served from storage on replica 1, and again on replica 0
after it was SIGKILLed and restarted (its own memory is gone; the store is not)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest
from cluster_harness import MODEL, SERVE_ARGS

from radixkv.cluster.launch import ClusterSpec, RunningCluster, start_cluster

PROMPT = "Shared handbook for every replica. " + " ".join(f"rule {k} holds" for k in range(40))


def _ask(url: str) -> tuple[str, int]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0.0)
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    return r.choices[0].text, int(r.usage.prompt_tokens_details.cached_tokens or 0)


def _stats(url: str) -> dict[str, object]:
    return dict(httpx.get(url + "/cache/stats", timeout=30).json())


def _written(cluster: RunningCluster, i: int) -> None:
    """Wait until replica i has written its pages to the store (writes are asynchronous)."""
    deadline = time.monotonic() + 60
    while True:
        tiers = _stats(cluster.worker_urls[i])["tier_stats"]
        assert isinstance(tiers, dict)
        if tiers["storage_writes_ok"] > 0 and tiers["storage_pending_writes"] == 0:
            return
        assert time.monotonic() < deadline, tiers
        time.sleep(0.2)


@pytest.mark.slow
def test_replicas_share_the_launchers_redis(model_dir: Path, tmp_path: Path) -> None:
    spec = ClusterSpec(
        replicas=2,
        model=str(model_dir),
        serve_args=(*SERVE_ARGS, "--page-size", "16"),
        router="none",
        shared_l3=True,
        log_dir=str(tmp_path),
    )
    with start_cluster(spec) as cluster:
        assert cluster.router_url is None and cluster.redis_url is not None
        r0, r1 = cluster.worker_urls
        text, cached = _ask(r0)
        assert cached == 0
        _written(cluster, 0)
        again, cached = _ask(r1)  # replica 1 never saw it: from the store
        assert again == text and cached > 0
        assert _stats(r1)["cached_tokens_by_tier"]["storage"] > 0  # type: ignore[index]

        cluster.kill_worker(0)
        cluster.restart_worker(0)
        after, cached = _ask(r0)
        assert after == text and cached > 0
        assert _stats(r0)["cached_tokens_by_tier"]["storage"] > 0  # type: ignore[index]
    assert all(not w.alive for w in cluster.workers)
    with pytest.raises(httpx.ConnectError):
        httpx.get(r0 + "/health", timeout=2)

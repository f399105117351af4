"""Two `radixkv serve` replicas publishing KV events behind a real vllm-router (pinned in
`radixkv.cluster.routers`) with `--policy kv_aware`: the router indexes each replica's exact
blocks from our ZMQ events (and its replay socket) and asks a replica's `/v1/completions/render`
for a prompt's token ids, so a prompt whose prefix one replica cached goes to that replica.

Each replica is warmed directly (not through the router) with its own tenant's prefix, so only
the events can tell the router where each prefix lives; then requests sharing one of the two
prefixes go through the router, one at a time (equal load: only the cache decides), and each
must be a cache hit on the replica that holds its prefix. Round robin or random would send about
half of them to the wrong replica (a miss); so would a router that did not decode the events.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from cluster_harness import AUTH, KEY, MODEL, SERVE_ARGS, requests_by_route, router_python_or_skip
from kv_subscriber import Subscriber

from radixkv.cluster.launch import ClusterSpec, RunningCluster, start_cluster

BS = 16


@pytest.fixture(scope="module")
def cluster(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCluster]:
    spec = ClusterSpec(
        replicas=2,
        model=str(model_dir),
        serve_args=(*SERVE_ARGS, "--page-size", str(BS)),
        policy="kv_aware",
        router="vllm-router",
        kv_events=True,
        router_python=str(router_python_or_skip("vllm-router")),
        api_key=KEY,  # the router must send it on to the replicas (render and requests)
        log_dir=str(tmp_path_factory.mktemp("kv-aware")),
    )
    with start_cluster(spec) as running:
        yield running


def _prefix(tenant: str) -> str:
    return f"Tenant {tenant} handbook. " + " ".join(f"clause {tenant}{k} holds" for k in range(30))


def _completions(url: str) -> float:
    return requests_by_route(url).get(("/v1/completions", "200"), 0.0)


@pytest.mark.slow
def test_kv_aware_routes_a_prefix_to_the_replica_that_cached_it(cluster: RunningCluster) -> None:
    assert cluster.router_url is not None
    subs = [
        Subscriber(pub, rep, replay_layout="topic")  # the launcher's for vllm-router
        for pub, rep in zip(cluster.kv_event_endpoints, cluster.kv_replay_endpoints, strict=True)
    ]
    try:
        prefixes = [_prefix("A"), _prefix("B")]
        for i, (url, prefix) in enumerate(zip(cluster.worker_urls, prefixes, strict=True)):
            direct = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
            r = direct.completions.create(
                model=MODEL, prompt=prefix + " Warm-up.", max_tokens=2, temperature=0.0
            )
            assert r.usage is not None and r.usage.prompt_tokens > 8 * BS
            subs[i].drain()  # published: the router's SUB receives the same batches
            assert len(subs[i].blocks) >= 8, subs[i].blocks
        time.sleep(1.0)  # margin for the router's indexer thread to apply them
        before = [_completions(u) for u in cluster.worker_urls]

        client = openai.OpenAI(base_url=cluster.router_url + "/v1", api_key=KEY, max_retries=0)
        hits: list[tuple[int, int, int]] = []
        # Not alternating: round robin would put half of these on the wrong replica.
        for k, tenant in enumerate((0, 0, 1, 1, 0, 1, 1, 0)):
            prompt = prefixes[tenant] + f" Question {k}: which clause applies?"
            r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
            assert r.usage is not None and r.usage.prompt_tokens_details is not None
            cached = r.usage.prompt_tokens_details.cached_tokens or 0
            hits.append((tenant, cached, r.usage.prompt_tokens))
        after = [_completions(u) for u in cluster.worker_urls]
        print(f"(tenant, cached, prompt) per routed request: {hits}; served {before} -> {after}")
        # Every routed request reused its tenant's warmed prefix (all but its last partial
        # block and the question): it ran on the replica that held it.
        for _, cached, prompt_tokens in hits:
            assert cached >= prompt_tokens - 3 * BS, hits
        assert [a - b for a, b in zip(after, before, strict=True)] == [4, 4]
        # The router learnt the token ids from our /render route.
        renders = sum(
            requests_by_route(u).get(("/v1/completions/render", "200"), 0.0)
            for u in cluster.worker_urls
        )
        assert renders >= 8
    finally:
        for s in subs:
            s.close()


@pytest.mark.slow
def test_a_router_started_after_the_replicas_cached_learns_it_by_replay(
    cluster: RunningCluster,
) -> None:
    """The router is down while each replica caches a tenant's prefix, so its SUB socket never
    sees those batches: only its request to the replay socket (from seq 0, made when a
    replica's first live batch arrives) can tell it.
    vllm-router applies replayed batches only in the `topic` replay layout (the launcher sets
    it); in the plain one it ignores them, and routes these tenants by load alone."""
    assert cluster.router is not None and cluster.router_url is not None
    cluster.router.kill()
    prefixes = [_prefix("C"), _prefix("D")]
    for url, prefix in zip(cluster.worker_urls, prefixes, strict=True):
        direct = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        direct.completions.create(model=MODEL, prompt=prefix + " Warm-up.", max_tokens=2)
    cluster.router.start()
    cluster.router.wait_ready(cluster._router_ready, 120)
    # Its SUB asks a replica's replay socket for the history (from seq 0) when that replica's
    # first live batch reaches it: each replica caches something unrelated, directly.
    for i, url in enumerate(cluster.worker_urls):
        direct = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        direct.completions.create(model=MODEL, prompt=_prefix(f"ping{i}"), max_tokens=2)
    time.sleep(1.5)  # the replays and the indexer thread applying them
    client = openai.OpenAI(base_url=cluster.router_url + "/v1", api_key=KEY, max_retries=0)
    hits = []
    for k, tenant in enumerate((0, 0, 1, 1, 0, 1)):
        prompt = prefixes[tenant] + f" Question {k}: which clause applies?"
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        hits.append(
            (tenant, r.usage.prompt_tokens_details.cached_tokens or 0, r.usage.prompt_tokens)
        )
    print(f"(tenant, cached, prompt) per routed request: {hits}")
    for _, cached, prompt_tokens in hits:
        assert cached >= prompt_tokens - 3 * BS, hits


def test_vllm_router_lists_both_replicas(cluster: RunningCluster) -> None:
    listed = {w["url"]: w["is_healthy"] for w in cluster.router_workers()}
    assert listed == dict.fromkeys(cluster.worker_urls, True)
    assert cluster.router_url is not None
    assert httpx.get(cluster.router_url + "/health", headers=AUTH, timeout=10).status_code == 200

"""Two real `radixkv serve` replicas behind a real SGLang Model Gateway (`smg`, pinned in
`radixkv.cluster.routers`), driven by the official `openai` client with concurrent requests.

The cluster is `radixkv.cluster.launch.start_cluster`'s; smg lives in a virtualenv of its own,
made once under the cache directory and reused. The test is skipped, saying so, only when pip
cannot reach the package registry.

What it checks: both replicas register (smg's probes, `/v1/loads` polls and requests all carry
the router's API key, which the replicas require); every request is answered, although one
replica is sized to refuse most of a burst (503 + Retry-After: smg retries elsewhere); the
`/render` route gives the token ids the chat request ran with; `POST /flush_cache` on the router
reaches both replicas.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from cluster_harness import AUTH, KEY, MODEL, SERVE_ARGS, requests_by_route, router_python_or_skip

from radixkv.cluster.launch import ClusterSpec, RunningCluster, start_cluster
from radixkv.model.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def cluster(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCluster]:
    # Replica 0 takes 1 running + 1 waiting request: a burst overloads it (503 + Retry-After).
    small = ("--max-running-requests", "1", "--max-queued-requests", "1")
    spec = ClusterSpec(
        replicas=2,
        model=str(model_dir),
        serve_args=SERVE_ARGS,
        router_python=str(router_python_or_skip("smg")),
        api_key=KEY,
        replica_args=(small,),
        log_dir=str(tmp_path_factory.mktemp("gateway")),
    )
    with start_cluster(spec) as running:
        yield running


@pytest.mark.slow
def test_replicas_behind_smg(cluster: RunningCluster, model_dir: Path) -> None:
    router, workers = cluster.router_url, cluster.worker_urls
    assert router is not None
    registered = httpx.get(router + "/workers", headers=AUTH, timeout=10).json()["workers"]
    assert sorted(w["url"] for w in registered) == sorted(workers)
    assert all(w["model_id"] == MODEL and w["is_healthy"] for w in registered), registered
    anonymous = httpx.post(router + "/v1/chat/completions", json={"model": MODEL}, timeout=10)
    assert anonymous.status_code == 401  # the router wants its key too

    client = openai.OpenAI(base_url=router + "/v1", api_key=KEY, max_retries=0, timeout=120)

    def ask(job: tuple[str, str]) -> Any:
        system, question = job
        messages: Any = [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ]
        kw: Any = {"max_tokens": 8, "temperature": 0.0, "extra_body": {"ignore_eos": True}}
        r = client.chat.completions.create(model=MODEL, messages=messages, **kw)
        return messages, r

    # Bursts of 8 concurrent requests, 4 per system prompt, which cache_aware keeps together.
    # Replica 0 (2 in flight at most) must get more than it holds at least once, and no client
    # may see it. Which replica a new prompt goes to is smg's choice (under load it can send a
    # whole burst to replica 1), so a burst of new tenants follows until replica 0 has refused
    # (cache_aware sends prompts it has not seen to the replica with the smaller tree).
    answers: list[Any] = []
    for burst in range(4):
        tenants = [
            f"You are assistant number {t}{burst}. " + f"Tenant {t} rules apply. " * 12
            for t in "ABCD"
        ]
        jobs = [
            (system, f"Question {q} about the radix cache?") for system in tenants for q in "1234"
        ]
        with ThreadPoolExecutor(8) as pool:
            answers += list(pool.map(ask, jobs))
        for _, r in answers:  # every request answered, in full
            assert r.choices[0].finish_reason == "length"
            assert r.usage is not None and r.usage.completion_tokens == 8
        # The replicas saw each request once as a success; replica 0's refusals were retried.
        by_worker = [requests_by_route(url) for url in workers]
        served = [c.get(("/v1/chat/completions", "200"), 0.0) for c in by_worker]
        assert sum(served) == len(answers), by_worker
        refused = by_worker[0].get(("/v1/chat/completions", "503"), 0.0)
        print(f"burst {burst}: served per replica {served}; replica 0 refused {refused}")
        if refused >= 1:
            break
    assert refused >= 1, by_worker
    # smg's registration probes and load polls reached both replicas with the key.
    deadline = time.monotonic() + 15
    while not all(c.get(("/v1/loads", "200"), 0) >= 1 for c in by_worker):
        assert time.monotonic() < deadline, by_worker
        time.sleep(0.5)
        by_worker = [requests_by_route(url) for url in workers]
    for counts in by_worker:
        assert not [k for k in counts if k[1] == "401"], counts
        assert counts.get(("/v1/models", "200"), 0) >= 1
    # ... and smg parsed them: its view of each replica's load is ours.
    for w in httpx.get(router + "/workers", headers=AUTH, timeout=10).json()["workers"]:
        (load,) = w["engine_load"]["loads"]
        assert load["max_total_num_tokens"] == 4096 and load["max_running_requests"] in (1, 32)

    # /render gives the token ids the request ran with (the model's own chat template).
    messages, r = answers[0]
    rendered = httpx.post(
        workers[1] + "/v1/chat/completions/render",
        json={"model": MODEL, "messages": messages, "max_tokens": 8},
        headers=AUTH,
        timeout=30,
    ).json()
    tok = Tokenizer.from_pretrained(model_dir)
    assert rendered["token_ids"] == list(tok.apply_chat_template(messages, True))
    assert r.usage is not None and len(rendered["token_ids"]) == r.usage.prompt_tokens

    # POST /flush_cache on the router reaches both replicas.
    before = [
        httpx.get(u + "/cache/stats", headers=AUTH).json()["cached_tokens_in_tree"] for u in workers
    ]
    assert sum(before) > 0
    flushed = httpx.post(router + "/flush_cache", headers=AUTH, timeout=30)
    assert flushed.status_code == 200, flushed.text
    assert flushed.json()["workers_flushed"] == 2
    for url in workers:
        stats = httpx.get(url + "/cache/stats", headers=AUTH).json()
        assert stats["cached_tokens_in_tree"] == 0
        assert requests_by_route(url)[("/flush_cache", "200")] == 1

"""Faults in a real cluster: two `radixkv serve` replicas publishing KV events (page 16, bound on
loopback, with replay sockets) behind a real smg (cache_aware), driven by the official `openai`
client with concurrent requests.

- Events dropped: a subscriber whose stream socket is closed while the replica publishes sees a
  gap in `seq` and fills it from the replay socket; its block table ends equal to that of a
  subscriber that never missed a batch.
- The router restarted mid-run (SIGKILL, same port): every request is answered (the client
  retries the connections the dead router dropped), and the new router finds both replicas.
- A replica SIGKILLed while it runs requests: no request is lost (smg retries on the other
  replica; the client does not retry), the replica restarts on its ports and rejoins (smg
  routes to it again), and a subscriber that kept its state across the restart (dropping any
  seq not newer than the last it applied) gets the new life's AllBlocksCleared above the old
  life's last seq (`seq_start` "time"), then exactly the blocks of the prompts it served since.
- The router restarted while a replica is down: smg starts with the other one and registers the
  returning replica within seconds of its coming back.

And first, with no fault: cache_aware sends each tenant's concurrent requests to the replica that
holds its prefix. Tests run in file order on one cluster; each leaves both replicas serving.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from cluster_harness import AUTH, KEY, MODEL, SERVE_ARGS, requests_by_route, router_python_or_skip
from kv_subscriber import Subscriber

from radixkv.cluster.launch import ClusterSpec, RunningCluster, start_cluster

BS = 16
Prefix = tuple[str | None, tuple[int, ...]]


@pytest.fixture(scope="module")
def cluster(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCluster]:
    spec = ClusterSpec(
        replicas=2,
        model=str(model_dir),
        serve_args=(*SERVE_ARGS, "--page-size", str(BS)),
        kv_events=True,
        # A new life's seq continues above the last one's: for the subscriber that keeps its
        # state across a replica's restart (test_replica_killed_...).
        kv_events_options=(("seq_start", "time"),),
        router_python=str(router_python_or_skip("smg")),
        api_key=KEY,
        log_dir=str(tmp_path_factory.mktemp("faults")),
    )
    with start_cluster(spec) as running:
        yield running


def _prompt(tag: str) -> str:
    return f"Session {tag} notes. " + " ".join(f"item {tag}.{k} is open" for k in range(25))


def _render(url: str, prompt: str) -> list[int]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
    r = httpx.post(url + "/v1/completions/render", json=body, headers=AUTH, timeout=30)
    return list(r.json()[0]["token_ids"])


def _blocks_of(ids: list[int]) -> set[Prefix]:
    return {(None, tuple(ids[:e])) for e in range(BS, len(ids) + 1, BS)}


def _ask_all(
    client: openai.OpenAI,
    prompts: list[str],
    during: Callable[[], None],
    retry_no_worker: list[int] | None = None,
) -> list[Any]:
    """Send every prompt at once (8 in flight), run `during` meanwhile; every answer in full.
    With `retry_no_worker`, a 404 "No worker available" is retried too (and counted there)."""

    def ask(prompt: str) -> Any:
        while True:
            try:
                return client.completions.create(
                    model=MODEL, prompt=prompt, max_tokens=24, temperature=0.0,
                    extra_body={"ignore_eos": True},
                )  # fmt: skip
            except openai.NotFoundError as exc:
                if retry_no_worker is None or "No worker available" not in str(exc):
                    raise
                retry_no_worker.append(1)
                time.sleep(0.2)

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(ask, p) for p in prompts]
        during()
        answers = [f.result() for f in futures]
    for r in answers:
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 24
    return answers


def _subscriber(cluster: RunningCluster, i: int) -> Subscriber:
    return Subscriber(cluster.kv_event_endpoints[i], cluster.kv_replay_endpoints[i])


def test_cache_aware_keeps_each_tenant_on_one_replica(cluster: RunningCluster) -> None:
    """Four tenants warmed one at a time, then 16 requests (4 per tenant) at once: smg's
    cache_aware tree sends each to the replica holding its tenant's prefix, so every one is a
    hit on the whole prefix (round robin would miss on about half)."""
    assert cluster.router_url is not None
    client = openai.OpenAI(base_url=cluster.router_url + "/v1", api_key=KEY, max_retries=0)
    tenants = [_prompt(f"t{t}") for t in range(4)]
    for p in tenants:  # warm-up, sequential: no prefix anywhere, smg spreads them
        _ask_all(client, [p + " Warm-up."], lambda: None)
    prompts = [p + f" Question {q}?" for q in range(4) for p in tenants]
    answers = _ask_all(client, prompts, lambda: None)
    cached = [r.usage.prompt_tokens_details.cached_tokens for r in answers]
    # The tenant's prefix in whole pages: all of the rendered prefix but its last partial page
    # (the suffixes differ from the warm-up's from their first token on).
    want = [len(_render(cluster.worker_urls[0], p[: -len(" Question 0?")])) for p in prompts]
    print(f"cached per request {cached}; prefix tokens {want}")
    assert all(c >= w - BS for c, w in zip(cached, want, strict=True)), (cached, want)
    served = [
        requests_by_route(u).get(("/v1/completions", "200"), 0.0) for u in cluster.worker_urls
    ]
    assert min(served) >= 4, served  # both replicas took tenants


def test_dropped_events_are_replayed(cluster: RunningCluster) -> None:
    steady, lossy = _subscriber(cluster, 0), _subscriber(cluster, 0)
    direct = openai.OpenAI(base_url=cluster.worker_urls[0] + "/v1", api_key=KEY, max_retries=0)
    try:
        steady.drain()
        lossy.drain()
        _ask_all(direct, [_prompt(f"d{k}") for k in range(2)], lambda: None)
        steady.drain()
        lossy.drain()
        lossy.hang_up()  # everything published from here on is lost to it
        _ask_all(direct, [_prompt(f"d{k}") for k in range(2, 6)], lambda: None)
        steady.drain()
        assert steady.next_seq is not None and lossy.next_seq is not None
        missed = steady.next_seq - lossy.next_seq
        assert missed >= 2
        lossy.reopen()
        _ask_all(direct, [_prompt("d6")], lambda: None)  # its first batch after the gap
        steady.drain()
        lossy.drain(until_seq=steady.next_seq - 1)
        assert lossy.replayed >= missed and lossy.holes == 0
        assert lossy.prefixes() == steady.prefixes() and len(lossy.blocks) > 20
    finally:
        steady.close()
        lossy.close()


def test_router_restarted_mid_run(cluster: RunningCluster) -> None:
    assert cluster.router_url is not None
    # The client retries what the dead router dropped (connection errors), as users' clients do.
    client = openai.OpenAI(base_url=cluster.router_url + "/v1", api_key=KEY, max_retries=8)
    first_pid = cluster.router.pid if cluster.router else None

    def restart() -> None:
        time.sleep(1.0)  # some requests are in flight through it
        cluster.restart_router()

    # A new smg listens before it has registered the replicas and answers 404 "No worker
    # available" meanwhile (about a second): clients retry that too (behind a load balancer
    # that waits for its /readiness, as deploy/kubernetes/gateway.yaml's probe, none see it).
    no_worker: list[int] = []
    _ask_all(client, [_prompt(f"r{k}") for k in range(16)], restart, no_worker)
    print(f"404 No worker available while the new router registered: {len(no_worker)}")
    assert cluster.router is not None and cluster.router.pid != first_pid
    listed = {w["url"]: w["is_healthy"] for w in cluster.router_workers()}
    assert listed == dict.fromkeys(cluster.worker_urls, True)


def _busy(url: str) -> bool:
    (load,) = httpx.get(url + "/v1/loads", headers=AUTH, timeout=5).json()["loads"]
    return int(load["num_running_reqs"]) > 0


def test_replica_killed_mid_run_loses_nothing_and_rejoins(cluster: RunningCluster) -> None:
    assert cluster.router_url is not None
    client = openai.OpenAI(base_url=cluster.router_url + "/v1", api_key=KEY, max_retries=0)
    victim = 1
    killed = threading.Event()
    # A subscriber that outlives the replica's restart: it keeps the last seq it applied and
    # drops what is not newer (the replicas start their seq from the clock: seq_start "time").
    sub = _subscriber(cluster, victim)

    def kill_when_busy() -> None:
        deadline = time.monotonic() + 60
        while not _busy(cluster.worker_urls[victim]):
            assert time.monotonic() < deadline, "replica 1 never got a request"
            time.sleep(0.05)
        cluster.kill_worker(victim)  # with a request running on it
        killed.set()

    try:
        sub.drain()  # the old life's stream so far (its socket dies with it: no drain after)
        old_next = sub.next_seq
        assert old_next is not None
        _ask_all(client, [_prompt(f"k{k}") for k in range(16)], kill_when_busy)
        assert killed.is_set()

        cluster.restart_worker(victim)  # returns once smg counts it healthy again
        # The old life's last batches (still queued here), then the new life's stream, above
        # them: a gap, filled from the new replay socket, that starts with AllBlocksCleared.
        sub.drain()
        assert sub.next_seq is not None and sub.next_seq > old_next and sub.holes >= 1
        assert sub.batches[-1][1][1] == [{"type": "AllBlocksCleared"}] and sub.blocks == {}
        # New prompts (no prefix anywhere), 8 at a time: smg balances them onto both replicas.
        prompts = [_prompt(f"n{k}") for k in range(16)]
        _ask_all(client, prompts, lambda: None)
        served = requests_by_route(cluster.worker_urls[victim]).get(("/v1/completions", "200"))
        assert served, "the restarted replica got no request back"
        sub.drain()
        table = sub.prefixes()
        ids = [_render(cluster.worker_urls[0], p) for p in prompts]
        announced = [i for i in ids if _blocks_of(i) <= table]
        # Exactly the prompts it served since its restart (its cache is new; nothing evicted).
        assert len(announced) == served, (len(announced), served)
        assert all(any(i[: len(t)] == list(t[: len(i)]) for i in ids) for _, t in table)
    finally:
        sub.close()


def test_router_restarted_while_a_replica_is_down_registers_it_when_back(
    cluster: RunningCluster,
) -> None:
    """smg restarted while replica 1 is down registers replica 0 alone; its attempt at replica 1
    goes on in the background. Once replica 1 answers again, smg counts it healthy within a
    couple of seconds (the launcher gives smg a 1 s startup-check interval; its default, 30 s,
    left a returning replica without traffic, or a one-replica cluster answering 404 No worker
    available, for up to half a minute), and requests reach it."""
    assert cluster.router_url is not None
    cluster.kill_worker(1)
    cluster.restart_router()  # ready with the live replica alone
    assert [w["url"] for w in cluster.router_workers()] == [cluster.worker_urls[0]]
    time.sleep(3)  # smg's first attempt at replica 1 has failed by now
    cluster.workers[1].start()
    cluster.workers[1].wait_ready(lambda: cluster._worker_up(1), 300)
    back = time.monotonic()
    assert cluster.router is not None
    cluster.router.wait_ready(cluster._router_ready, 60)
    waited = time.monotonic() - back
    print(f"smg registered the returning replica {waited:.2f} s after it answered /health")
    assert waited < 8, waited
    before = requests_by_route(cluster.worker_urls[1]).get(("/v1/completions", "200"), 0.0)
    client = openai.OpenAI(base_url=cluster.router_url + "/v1", api_key=KEY, max_retries=0)
    _ask_all(client, [_prompt(f"b{k}") for k in range(8)], lambda: None)
    after = requests_by_route(cluster.worker_urls[1]).get(("/v1/completions", "200"), 0.0)
    assert after > before  # smg routes to it again

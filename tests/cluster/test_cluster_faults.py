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
from concurrent.futures import Future, ThreadPoolExecutor
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


def _ask(client: openai.OpenAI, prompt: str, retry_no_worker: list[int] | None = None) -> Any:
    """One completion; with `retry_no_worker`, a 404 "No worker available" is retried too (and
    counted there)."""
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


def _ask_all(
    client: openai.OpenAI,
    prompts: list[str],
    during: Callable[[list[Future[Any]]], None],
    retry_no_worker: list[int] | None = None,
) -> list[Any]:
    """Send every prompt at once (8 in flight), run `during` on their futures meanwhile; every
    answer in full."""

    def ask(prompt: str) -> Any:
        return _ask(client, prompt, retry_no_worker)

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(ask, p) for p in prompts]
        during(futures)
        answers = [f.result() for f in futures]
    for r in answers:
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 24
    return answers


def _idle(futures: list[Future[Any]]) -> None:
    """Nothing to do while the requests run."""


def _served_since(
    cluster: RunningCluster, client: openai.OpenAI, i: int, tag: str, timeout_s: float = 30
) -> tuple[list[str], float]:
    """New prompts (no prefix anywhere), 8 at a time, until replica i has served one since the
    call (smg sends a cold prompt to either replica, by chance and the loads it last polled,
    and not to one whose breaker is open: the launcher lets one try again after 5 s). Returns
    the prompts sent and how many of them replica i served."""
    before = _completions_served(cluster)[i]
    prompts: list[str] = []
    deadline = time.monotonic() + timeout_s
    while (served := _completions_served(cluster)[i] - before) == 0:
        assert time.monotonic() < deadline, f"replica {i} got no request back"
        batch = [_prompt(f"{tag}{len(prompts) + k}") for k in range(8)]
        _ask_all(client, batch, _idle)
        prompts += batch
    return prompts, served


def _subscriber(cluster: RunningCluster, i: int) -> Subscriber:
    return Subscriber(cluster.kv_event_endpoints[i], cluster.kv_replay_endpoints[i])


def _completions_served(cluster: RunningCluster) -> list[float]:
    return [requests_by_route(u).get(("/v1/completions", "200"), 0.0) for u in cluster.worker_urls]


def test_cache_aware_keeps_each_tenant_on_one_replica(cluster: RunningCluster) -> None:
    """Tenants warmed one at a time until each replica holds two, then 16 requests (4 for each
    of those four tenants) at once: smg's cache_aware tree sends each to the replica holding its
    tenant's prefix, so every one is a hit on the whole prefix (round robin would miss on about
    half) and each replica serves its own tenants' eight."""
    assert cluster.router_url is not None
    client = openai.OpenAI(base_url=cluster.router_url + "/v1", api_key=KEY, max_retries=0)
    # A cold prompt (no prefix anywhere) goes to either replica (smg breaks the tie between
    # idle replicas by chance: four in a row on one is one run in eight), so warm new tenants
    # until both hold two.
    homes: dict[int, list[str]] = {0: [], 1: []}
    for t in range(24):
        if min(len(v) for v in homes.values()) >= 2:
            break
        before = _completions_served(cluster)
        _ask_all(client, [_prompt(f"t{t}") + " Warm-up."], _idle)
        after = _completions_served(cluster)
        (home,) = [i for i in homes if after[i] > before[i]]
        homes[home].append(_prompt(f"t{t}"))
    assert min(len(v) for v in homes.values()) >= 2, homes
    tenants = [p for i in homes for p in homes[i][:2]]
    before = _completions_served(cluster)
    prompts = [p + f" Question {q}?" for q in range(4) for p in tenants]
    answers = _ask_all(client, prompts, _idle)
    cached = [r.usage.prompt_tokens_details.cached_tokens for r in answers]
    # The tenant's prefix in whole pages: all of the rendered prefix but its last partial page
    # (the suffixes differ from the warm-up's from their first token on).
    want = [len(_render(cluster.worker_urls[0], p[: -len(" Question 0?")])) for p in prompts]
    print(f"cached per request {cached}; prefix tokens {want}")
    assert all(c >= w - BS for c, w in zip(cached, want, strict=True)), (cached, want)
    served = [a - b for a, b in zip(_completions_served(cluster), before, strict=True)]
    assert served == [8.0, 8.0], served  # each replica its own two tenants' questions


def test_dropped_events_are_replayed(cluster: RunningCluster) -> None:
    steady, lossy = _subscriber(cluster, 0), _subscriber(cluster, 0)
    direct = openai.OpenAI(base_url=cluster.worker_urls[0] + "/v1", api_key=KEY, max_retries=0)
    try:
        steady.drain()
        lossy.drain()
        _ask_all(direct, [_prompt(f"d{k}") for k in range(2)], _idle)
        steady.drain()
        lossy.drain()
        lossy.hang_up()  # everything published from here on is lost to it
        _ask_all(direct, [_prompt(f"d{k}") for k in range(2, 6)], _idle)
        steady.drain()
        assert steady.next_seq is not None and lossy.next_seq is not None
        missed = steady.next_seq - lossy.next_seq
        assert missed >= 2
        lossy.reopen()
        _ask_all(direct, [_prompt("d6")], _idle)  # its first batch after the gap
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

    def restart(futures: list[Future[Any]]) -> None:
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

    def kill_when_busy(futures: list[Future[Any]]) -> None:
        while not all(f.done() for f in futures):
            if _busy(cluster.worker_urls[victim]):
                cluster.kill_worker(victim)  # with a request running on it
                killed.set()
                return
            time.sleep(0.05)

    try:
        sub.drain()  # the old life's stream so far (its socket dies with it: no drain after)
        old_next = sub.next_seq
        assert old_next is not None
        # Cold prompts, 8 at a time, until one runs on the victim (smg may send a whole batch
        # to the other replica).
        for r in range(8):
            _ask_all(client, [_prompt(f"k{r}.{k}") for k in range(8)], kill_when_busy)
            if killed.is_set():
                break
        assert killed.is_set(), "replica 1 never got a request"

        cluster.restart_worker(victim)  # returns once smg counts it healthy again
        # The old life's last batches (still queued here), then the new life's stream, above
        # them: a gap, filled from the new replay socket, that starts with AllBlocksCleared.
        sub.drain()
        assert sub.next_seq is not None and sub.next_seq > old_next and sub.holes >= 1
        assert sub.batches[-1][1][1] == [{"type": "AllBlocksCleared"}] and sub.blocks == {}
        prompts, served = _served_since(cluster, client, victim, "n")
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
    client = openai.OpenAI(base_url=cluster.router_url + "/v1", api_key=KEY, max_retries=0)
    _served_since(cluster, client, 1, "b")  # smg routes to it again

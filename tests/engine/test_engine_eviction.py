"""Session-aware eviction and live regret through the engine (toy model)."""

from __future__ import annotations

import operator

from engine_helpers import GREEDY, make_engine, shared_prefix_workload

from radixkv.cache.policies.research.regret import RegretWindow
from radixkv.engine.types import RequestOptions


def test_session_reference_keeps_a_prefix_until_the_session_closes() -> None:
    prompts = shared_prefix_workload()
    eng = make_engine(page_size=4, eviction_policy="session-lru")
    chat = RequestOptions(session_id="chat-1")
    eng.generate([prompts[0]], GREEDY, options=chat)
    eng.generate([prompts[5]], GREEDY)  # no session: evicted first, though more recent
    cache = eng.cache
    assert cache is not None and cache.open_sessions == 1
    before = eng.generate([prompts[0]], GREEDY, options=chat)[0].cached_tokens
    anchor = cache._sessions.refs()[0].node
    held = anchor.depth + anchor.ntok  # the session's path, prompt and output
    # Evict everything but that path: the unreferenced prefixes must all go first.
    eng.allocator.free_slots_of_pages(cache.evict(cache.total_size - held))
    eng.check_memory()
    assert cache.total_size == held
    kept = eng.generate([prompts[0]], GREEDY)[0].cached_tokens
    assert kept == before > 0
    assert operator.methodcaller("close_session", "chat-1")(eng) is True
    assert cache.open_sessions == 0 and eng.close_session("chat-1") is False
    eng.check_memory()


def test_regret_window_reports_live_and_belady_hit_rates() -> None:
    prompts = shared_prefix_workload()
    eng = make_engine(page_size=4)
    for p in prompts:
        eng.generate([p], GREEDY)
    rep = operator.methodcaller("regret_stats")(eng)
    assert rep["enabled"] and rep["requests"] == len(prompts)
    assert 0 < rep["live_hit_rate"] <= rep["belady_hit_rate"] <= 1
    assert rep["capacity_tokens"] == eng.allocator.num_slots
    m = eng.metrics()
    assert m.window_requests == len(prompts) and m.window_belady_hit_rate > 0
    assert rep["fresh"]  # idle: replayed whole, now
    assert make_engine(regret_window=0).regret_stats() == {"enabled": False}


def test_regret_stats_while_busy_do_not_replay_on_the_spot() -> None:
    """With requests in flight, `regret_stats` returns the last report and starts a sliced
    replay that the steps carry on; it shows up once the steps have run it."""
    prompts = shared_prefix_workload()
    eng = make_engine(page_size=4)
    for p in prompts[:3]:
        eng.generate([p], GREEDY)
    assert eng.regret_stats()["requests"] == 3
    eng.add_request(prompts[3], GREEDY)
    eng.step()  # admitted (recorded), still running
    window = eng.scheduler.regret
    assert window is not None and eng.scheduler.has_work
    busy = eng.regret_stats()
    assert not busy["fresh"] and busy["requests"] == 3  # the last report, not recomputed
    assert window.replaying
    while eng.scheduler.has_work:
        eng.step()
    assert not window.replaying and window.last.requests == 4  # the steps finished it
    eng.check_memory()


def test_regret_window_is_bounded_and_periodic() -> None:
    w = RegretWindow(page_size=2, capacity_tokens=4, max_requests=3, every=2)
    for i in range(5):
        w.record([1, 2, 3, 4, 5], None, 5, 4 if i else 0)
    assert len(w) == 3
    assert w.last.requests == 3  # computed at the 4th record, on the last three
    rep = w.compute()
    # Belady from cold: the first of three misses, the other two hit two pages (4 tokens).
    assert rep.belady_hit_rate == 8 / 15 and rep.live_hit_rate == 12 / 15
    assert rep.regret == 0.0


def test_server_closes_sessions_and_shows_the_bound() -> None:
    """Through the real HTTP server: a session's close releases its cache reference, and
    /cache/stats and /metrics show the live hit rate beside Belady's over the window."""
    import httpx

    from radixkv.server.background import BackgroundServer

    eng = make_engine(page_size=4, eviction_policy="session-lru")
    text = "a shared system prompt for the toy model. " * 3
    with BackgroundServer(eng, "toy") as srv:
        for q in ("one", "two", "three"):
            body = {"prompt": text + q, "max_tokens": 3, "temperature": 0, "session_id": "s1"}
            assert httpx.post(srv.url + "/v1/completions", json=body, timeout=60).status_code == 200
        stats = httpx.get(srv.url + "/cache/stats", timeout=60).json()
        reg = stats["regret"]
        assert reg["enabled"] and reg["requests"] == 3
        assert 0 < reg["live_hit_rate"] <= reg["belady_hit_rate"]
        assert eng.cache is not None and eng.cache.open_sessions == 1
        closed = httpx.post(srv.url + "/sessions/s1/close", timeout=60).json()
        assert closed["closed"] and closed["cache_reference_released"]
        assert eng.cache.open_sessions == 0
        metrics = httpx.get(srv.url + "/metrics", timeout=60).text
        assert "radixkv_window_belady_token_hit_rate" in metrics
        assert "radixkv_window_token_hit_rate" in metrics


def test_bench_eviction_runs_each_policy_on_a_small_pool() -> None:
    """`radixkv bench eviction`'s core on the toy model: sessions close after their last
    request, hit rates are bounded by Belady's, memory balances."""
    from engine_toy import ToyLM

    from radixkv.bench.eviction import run_policy
    from radixkv.engine.types import EngineConfig

    prompts = shared_prefix_workload()
    reqs = [(p, 2, f"s{i % 3}") for i, p in enumerate(prompts * 2)]
    base = EngineConfig(device="cpu", num_slots=256, page_size=4, chunked_prefill_size=64)
    rows = [run_policy(ToyLM(), base, pol, reqs) for pol in ("lru", "predict", "session-lru")]
    for row in rows:
        assert row["requests"] == len(reqs) and row["prompt_tokens"] > 0
        assert 0 < row["token_hit_rate"] <= row["regret"]["belady_hit_rate"] + 1e-9

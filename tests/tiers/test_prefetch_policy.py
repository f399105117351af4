"""The prefetch policies' cost model (radixkv.engine.tiers.prefetch), unit-tested without storage or
a model: a slow backend is recomputed, a fast one is waited for, an unhealthy one is not, and the
SGLang policies keep their meaning. Then the decision through an engine (toy model, file L3): a
slow or failing backend is not waited for, and the counts show in the tier stats and /metrics."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import make_engine, run_checked
from prometheus_client.parser import text_string_to_metric_families
from tier_helpers import (
    LM,
    SlowBackend,
    pin_prefill_speed,
    reference,
    run_one_by_one,
    tier_engine,
)

from radixkv.engine.engine import Engine
from radixkv.engine.tiers.prefetch import WAIT_COMPLETE_CAP_S, PrefetchPolicy, RunningLine
from radixkv.engine.types import EngineMetrics, SamplingParams
from radixkv.server.metrics import ServerMetrics

PAGE = 16
PAGE_BYTES = 30 * 2 * 16 * 3 * 64 * 2  # SmolLM2-135M, bfloat16, page 16: 368,640 bytes
PAGES = 93  # a 1,500-token prompt


def measured(
    bytes_per_s: float,
    rtt_s: float = 0.0005,
    prefill_tokens_per_s: float = 1000.0,
    step_s: float = 0.002,
    **kw: Any,
) -> PrefetchPolicy:
    """A cost_aware policy that observed fetches and prefill steps of the given speeds."""
    p = PrefetchPolicy(timeout_s=kw.pop("timeout_s", 2.0), chunk_tokens=2048, **kw)
    for _ in range(4):
        for pages in (0, 5, 32):  # misses and hits: the latency and the bandwidth
            nbytes = pages * PAGE_BYTES
            p.observe_fetch([(nbytes, rtt_s + nbytes / bytes_per_s)])
        for tokens in (16, 300, 2048):
            p.observe_prefill(tokens, step_s + tokens / prefill_tokens_per_s)
    return p


def test_running_line_fits_drifts_and_degenerates() -> None:
    line = RunningLine()
    assert line.fit() == (None, None)
    for x in (0.0, 1e3, 2e3, 4e3, 8e3):
        line.observe(x, 0.001 + 2e-6 * x)
    a, b = line.fit()
    assert a == pytest.approx(0.001) and b == pytest.approx(2e-6)
    for _ in range(200):  # the backend got twice as slow: recent observations dominate
        for x in (0.0, 4e3):
            line.observe(x, 0.001 + 4e-6 * x)
    a, b = line.fit()
    assert a == pytest.approx(0.001, rel=0.05) and b == pytest.approx(4e-6, rel=0.05)

    misses = RunningLine()
    misses.observe(0.0, 0.003)
    assert misses.fit() == (pytest.approx(0.003), None)  # latency only, bandwidth unknown
    same = RunningLine()
    for _ in range(3):
        same.observe(10.0, 0.5)
    assert same.fit() == (0.0, pytest.approx(0.05))  # all at one x: proportional
    noisy = RunningLine()
    for x, y in ((1.0, 0.9), (2.0, 0.5), (3.0, 0.1)):  # slope <= 0 is noise: flat
        noisy.observe(x, y)
    assert noisy.fit() == (pytest.approx(0.5, rel=0.05), 0.0)


def test_fast_backend_is_waited_for() -> None:
    p = measured(bytes_per_s=1e9)  # local Redis-class bandwidth vs a 1,000 tok/s CPU prefill
    d = p.decide(PAGES, PAGE, PAGE_BYTES)
    assert d.wait and d.reason == "cheaper"
    assert d.load_s is not None and d.recompute_s is not None
    assert d.load_s == pytest.approx(3 * 0.0005 + PAGES * PAGE_BYTES / 1e9, rel=0.01)
    assert d.recompute_s == pytest.approx(0.002 + PAGES * PAGE / 1000.0, rel=0.01)
    assert d.bound_s == pytest.approx(d.recompute_s)  # never past recomputing


def test_slow_backend_is_recomputed() -> None:
    p = measured(bytes_per_s=10e6)  # 10 MB/s: 3.4 s for the 34 MB the prompt's pages weigh
    d = p.decide(PAGES, PAGE, PAGE_BYTES)
    assert not d.wait and d.reason == "slower"
    assert d.load_s is not None and d.recompute_s is not None and d.load_s > d.recompute_s


def test_fast_prefill_is_recomputed() -> None:
    # A GPU prefills 1,488 tokens in ~15 ms: a 1 GB/s fetch of 34 MB (~35 ms) does not pay.
    d = measured(bytes_per_s=1e9, prefill_tokens_per_s=1e5, step_s=0.0).decide(
        PAGES, PAGE, PAGE_BYTES
    )
    assert not d.wait and d.reason == "slower"


def test_unhealthy_backend_is_recomputed() -> None:
    d = measured(bytes_per_s=1e9).decide(PAGES, PAGE, PAGE_BYTES, healthy=False)
    assert not d.wait and d.reason == "unhealthy"
    assert not PrefetchPolicy().decide(PAGES, PAGE, PAGE_BYTES, healthy=False).wait


def test_queue_ahead_bounds_the_wait_and_a_slow_prefill_waits_past_the_timeout() -> None:
    p = measured(bytes_per_s=1e9)
    assert not p.decide(PAGES, PAGE, PAGE_BYTES, queued_pages=4000).wait  # behind 1.5 GB
    # Past the 2 s timeout but cheaper than a 10 s recompute (a loaded CPU): waited for, at
    # most as long as recomputing would take.
    slow_prefill = measured(bytes_per_s=15e6, prefill_tokens_per_s=150.0)
    d = slow_prefill.decide(PAGES, PAGE, PAGE_BYTES)
    assert d.load_s is not None and d.recompute_s is not None
    assert 2.0 < d.load_s < d.recompute_s and d.wait and d.reason == "cheaper"
    assert d.bound_s == pytest.approx(d.recompute_s)
    # ... and a recompute past the cap is waited for at most WAIT_COMPLETE_CAP_S
    crawl = measured(bytes_per_s=15e6, prefill_tokens_per_s=10.0).decide(PAGES, PAGE, PAGE_BYTES)
    assert crawl.wait and crawl.bound_s == WAIT_COMPLETE_CAP_S


def test_unmeasured_waits_bounded_then_learns() -> None:
    p = PrefetchPolicy(timeout_s=2.0)
    d = p.decide(PAGES, PAGE, PAGE_BYTES)  # a fresh server: its own fetch will measure
    assert d.wait and d.reason == "unmeasured" and d.bound_s == 2.0
    p.observe_prefill(1500, 0.05)  # prefill measured, the backend not yet: bounded by it
    d = p.decide(PAGES, PAGE, PAGE_BYTES)
    assert d.wait and d.reason == "unmeasured" and d.bound_s == pytest.approx(0.05 * 1488 / 1500)
    p.observe_fetch([(0, 0.5)])  # only misses so far, each round trip 0.5 s: already slower
    d = p.decide(PAGES, PAGE, PAGE_BYTES)
    assert not d.wait and d.reason == "slower"


def test_extensions_that_only_miss_are_not_waited_for() -> None:
    """A conversation's new turn continues a prefix held locally and was never stored: once
    such fetches are seen to miss, they are not waited for, while known pages and cold prompts
    (a restarted server's) still are; one that starts finding pages is waited for again."""
    p = measured(bytes_per_s=1e9)
    turn = 8  # pages of a 128-token turn
    d = p.decide(turn, PAGE, PAGE_BYTES, first="extension")
    assert d.wait and d.reason == "cheaper"  # nothing known about extensions yet
    p.observe_found("extension", 0, turn)
    d = p.decide(turn, PAGE, PAGE_BYTES, first="extension")
    assert not d.wait and d.reason == "miss"
    assert p.decide(PAGES, PAGE, PAGE_BYTES, first="known").wait
    assert p.decide(PAGES, PAGE, PAGE_BYTES, first="cold").wait
    for _ in range(3):
        p.observe_found("cold", 0, PAGES)  # cold misses never stop a cold prompt's wait
    assert p.decide(PAGES, PAGE, PAGE_BYTES, first="cold").wait
    p.observe_found("extension", turn, turn)  # another replica stores continuations
    d = p.decide(turn, PAGE, PAGE_BYTES, first="extension")
    assert d.wait and d.reason == "cheaper"
    unmeasured = PrefetchPolicy()  # a fresh server: misses alone say nothing of the cost
    unmeasured.observe_found("extension", 0, turn)
    d = unmeasured.decide(turn, PAGE, PAGE_BYTES, first="extension")
    assert not d.wait and d.reason == "miss"
    s = p.stats()
    assert 0.0 < s["prefetch_est_found_extension"] < 1.0 and s["prefetch_est_found_cold"] == 0.0
    assert s["prefetch_est_found_known"] == -1.0  # none fetched


def test_pages_the_replica_confirmed_in_storage_are_waited_for_whatever_the_found_rate() -> None:
    """Fetches of prefixes still being computed elsewhere find few pages and pull the found
    rate of known first pages down; a request whose own pages this replica confirmed in L3 is
    still waited for (the known run is a floor of the share), one whose pages it knows only in
    part is decided on that part."""
    p = measured(bytes_per_s=3e8, prefill_tokens_per_s=3000.0)  # load 0.11 s, recompute 0.5 s
    for _ in range(6):
        p.observe_found("known", 10, PAGES)
    d = p.decide(PAGES, PAGE, PAGE_BYTES, first="known")
    assert not d.wait and d.reason == "miss"
    d = p.decide(PAGES, PAGE, PAGE_BYTES, first="known", known_pages=PAGES)
    assert d.wait and d.reason == "cheaper"
    assert not p.decide(PAGES, PAGE, PAGE_BYTES, first="known", known_pages=1).wait
    assert p.decide(PAGES, PAGE, PAGE_BYTES, first="known", known_pages=PAGES - 2).wait


def test_sglang_policies_keep_their_meaning() -> None:
    slow = {"bytes_per_s": 1e3}
    assert not measured(bytes_per_s=1e12, name="best_effort").decide(PAGES, PAGE, 1).wait
    d = measured(name="wait_complete", **slow).decide(PAGES, PAGE, PAGE_BYTES)
    assert d.wait and d.bound_s == WAIT_COMPLETE_CAP_S
    d = measured(name="timeout", timeout_s=0.7, **slow).decide(PAGES, PAGE, PAGE_BYTES)
    assert d.wait and d.bound_s == 0.7
    with pytest.raises(ValueError, match="unknown prefetch policy"):
        PrefetchPolicy("sometimes").decide(1, PAGE, PAGE_BYTES)


def test_decisions_are_counted_in_stats() -> None:
    p = measured(bytes_per_s=1e9)
    for healthy in (True, True, False):
        p.count(p.decide(PAGES, PAGE, PAGE_BYTES, healthy=healthy))
    p.released(0.25, timed_out=True)
    s = p.stats()
    assert s["prefetch_waited"] == 2 and s["prefetch_skipped"] == 1
    assert s["prefetch_decided_cheaper"] == 2 and s["prefetch_decided_unhealthy"] == 1
    assert s["prefetch_timed_out"] == 1 and s["prefetch_wait_s_total"] == 0.25
    assert s["prefetch_est_fetch_bytes_per_s"] == pytest.approx(1e9, rel=0.01)
    assert s["prefetch_est_fetch_rtt_s"] == pytest.approx(0.0005, rel=0.01)
    assert s["prefetch_est_prefill_tokens_per_s"] == pytest.approx(1000.0, rel=0.01)
    assert s["prefetch_last_waited"] == 0  # the unhealthy one
    assert all(isinstance(v, int | float) for v in s.values())  # they become gauges
    fams = {
        f.name: f
        for f in text_string_to_metric_families(
            ServerMetrics(lambda: EngineMetrics(*[0] * 11, tier_stats=s)).render().decode()
        )
    }
    assert fams["radixkv_hicache_prefetch_waited"].samples[0].value == 2
    assert fams["radixkv_hicache_prefetch_est_fetch_bytes_per_s"].samples[0].value > 0


# -- through an engine (toy model, file L3) ------------------------------------------------------


def _file(tmp: Path) -> dict[str, Any]:
    return {"hicache_storage_backend": "file", "hicache_storage_url": str(tmp / "l3")}


def _filled(tmp: Path) -> None:
    a = tier_engine(**_file(tmp))
    assert run_one_by_one(a) == reference() and a.close()


def _wrap(e: Engine, **kw: Any) -> None:
    assert e.tiers is not None and e.tiers.worker is not None
    e.tiers.worker.backend = SlowBackend(e.tiers.worker.backend, **kw)


def test_slow_backend_is_not_waited_for_once_measured(tmp_path: Path) -> None:
    _filled(tmp_path)
    b = tier_engine(**_file(tmp_path))  # the default policy: cost_aware
    _wrap(b, delay_s=0.3)  # 0.3 s a round trip, against a toy prefill of about a millisecond
    t0 = time.perf_counter()
    assert run_one_by_one(b) == reference()
    elapsed = time.perf_counter() - t0
    s = b.metrics().tier_stats
    assert s["prefetch_decided_slower"] >= 4, s
    assert s["prefetch_waited"] <= 2, s  # only before the first round trip was measured
    assert elapsed < 0.3 * 6, elapsed  # not one round trip per request
    b.close()


def test_failing_backend_is_not_waited_for(tmp_path: Path) -> None:
    _filled(tmp_path)
    b = tier_engine(**_file(tmp_path))
    _wrap(b, down=True)
    assert run_one_by_one(b) == reference()
    s = b.metrics().tier_stats
    assert s["storage_healthy"] == 0 and s["prefetch_decided_unhealthy"] >= 1, s
    assert b.metrics().cached_tokens_by_tier["storage"] == 0
    b.close()


def test_new_turns_of_a_conversation_are_not_held(tmp_path: Path) -> None:
    """Multi-turn with the history in L1 and a file L3 (the default policy): each new turn's
    pages are fetched (they can only miss); only the first such fetch is waited for. Before,
    every turn waited for its all-miss round trip ("unmeasured"). Outputs stay exact.

    The prefill is pinned at 10 tokens/s (seconds a turn): measured, the toy's ~1 ms recompute
    is as long as a file round trip on a loaded machine, and turns were then decided "slower"
    (not "miss"), or the first new turn's hold ran out before its fetch told what it found."""
    rng = random.Random(5)
    sp = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    ref = make_engine(LM, disable_radix_cache=True)
    e = tier_engine(num_slots=2048, **_file(tmp_path))
    pin_prefill_speed(e, 10.0)
    history: list[int] = []
    for _ in range(6):
        history += [rng.randrange(38) for _ in range(40)]
        want = run_checked(ref, [history], sp)[0].output_token_ids
        got = run_checked(e, [history], sp)[0].output_token_ids
        assert got == want
        history += got
    s = e.metrics().tier_stats
    assert s["prefetch_waited"] == 2, s  # the first prompt (cold) and the first new turn
    assert s["prefetch_decided_unmeasured"] == 2 and s["prefetch_decided_miss"] == 4, s
    assert s["prefetch_est_found_extension"] == 0.0, s
    assert e.metrics().cached_tokens_by_tier["device"] >= 5 * 40  # the history, from L1
    e.close()

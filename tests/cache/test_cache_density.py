"""The `density` policy: its life table (exact Kaplan-Meier bookkeeping, the index) and its
eviction order on hand-built workloads, with integrity checks after every step."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from radixkv.cache import RadixCache, available_policies
from radixkv.cache.policies.research.density import DensityPolicy, log4_bucket
from radixkv.cache.policies.research.lifetable import (
    COARSE,
    FINE,
    HORIZON,
    LO,
    NB,
    WIDTH,
    LifeTable,
    age_bucket,
    gittins_index,
)


def table(classes: int = 1, period: int = 1 << 40, decay: float = 1.0) -> LifeTable:
    return LifeTable([0] * classes, period=period, decay=decay, prior=0.0)


# ---------------------------------------------------------------- life table


def test_age_buckets_cover_every_age_once() -> None:
    ages = [*range(0, 5000), *range(5000, HORIZON + 4 * FINE, 97)]
    prev = 0
    for age in ages:
        b = age_bucket(age)
        assert b >= prev
        prev = b
        if b < NB - 1:
            assert LO[b] <= age < LO[b] + WIDTH[b]
        else:
            assert age >= HORIZON == LO[NB - 1]
    assert all(WIDTH[b] >= 8 * COARSE for b in range(NB) if LO[b] >= FINE)


def _simulate(lives: list[tuple[int, int, bool, int]]) -> LifeTable:
    """Feed (birth, age at end, reused?, tokens) lives through a table in tick order, with
    `advance` called only at event ticks (ends before births within a tick)."""
    events: dict[int, list[tuple[int, int, int, bool, int]]] = {}
    for born, age, reused, tok in lives:
        events.setdefault(born, []).append((1, born, age, reused, tok))
        events.setdefault(born + age, []).append((0, born, age, reused, tok))
    t = table()
    for tick in sorted(events):
        t.advance(tick)
        for kind, born, _, reused, tok in sorted(events[tick]):
            if kind == 0:
                t.end(0, born, tok, tick, reused)
            else:
                t.birth(0, tok, tick)
    return t


def test_at_risk_and_reuses_are_exact_including_coarse_slots() -> None:
    """Every life has ended: the at-risk mass of bucket b is exactly the tokens of lives that
    reached its lower edge, and reuses sit in the bucket of their age (fine and coarse
    rings alike; ends at age 0 and lives born on the same tick included)."""
    rng = random.Random(5)
    lives = []
    for _ in range(3000):
        born = rng.randrange(0, 30000)
        age = int(rng.expovariate(1 / 900)) if rng.random() < 0.9 else rng.randrange(0, 3)
        lives.append((born, min(age, HORIZON - 1), rng.random() < 0.7, rng.randrange(1, 5)))
    t = _simulate(lives)
    risk = np.zeros(NB)
    reuse = np.zeros(NB)
    for _, age, reused, tok in lives:
        risk[: age_bucket(age) + 1] += tok
        if reused:
            reuse[age_bucket(age)] += tok
    assert np.array_equal(t.risk[0], risk)
    assert np.array_equal(t.reuse[0], reuse)
    assert t.live_tokens() == 0


def test_km_hazard_recovers_a_known_geometric_reuse_time_under_censoring() -> None:
    rng = random.Random(1)
    p = 0.003  # reuse chance per tick; censored independently at a uniform age
    lives = []
    for _ in range(6000):
        reuse_age = int(rng.expovariate(p))
        censor_age = rng.randrange(0, 3000)
        age = min(reuse_age, censor_age)
        lives.append((rng.randrange(0, 20000), age, reuse_age <= censor_age, 1))
    t = _simulate(lives)
    for b in range(8, age_bucket(2000)):
        h = t.reuse[0, b] / t.risk[0, b]
        want = 1 - (1 - p) ** WIDTH[b]
        assert h == pytest.approx(want, rel=0.35, abs=0.01), b


def test_lives_past_the_horizon_are_forgotten() -> None:
    t = table()
    t.advance(5)
    t.birth(0, 7, 5)
    gone = 5 - 5 % COARSE + HORIZON + FINE
    t.advance(gone - 1)
    assert t.live_tokens() == 7 and t.tracked(5, gone - 1)
    t.advance(gone)
    assert t.live_tokens() == 0 and not t.tracked(5, gone)
    before = t.reuse.copy()
    t.end(0, 5, 7, gone, True)  # a reuse too late to count
    assert np.array_equal(t.reuse, before) and t.live_tokens() == 0


def _brute_index(h: np.ndarray, known: int) -> np.ndarray:
    out = np.zeros(NB)
    for b in range(known):
        best, hits, ticks, surv = 0.0, 0.0, 0.0, 1.0
        for e in range(b, known):
            hits += surv * h[e]
            ticks += surv * (1 - h[e] / 2) * WIDTH[e]
            surv *= 1 - h[e]
            if ticks > 0:
                best = max(best, hits / ticks)
        out[b] = best
    return out


def test_gittins_index_matches_brute_force() -> None:
    rng = np.random.default_rng(3)
    h = rng.random((3, NB)) ** 4
    h[1, 20] = 1.0  # certain reuse in one bucket
    h[2] = 0.0
    idx = gittins_index(h, 40)
    for c in range(3):
        np.testing.assert_allclose(idx[c], _brute_index(h[c], 40), rtol=1e-9, atol=1e-15)
    assert not idx[:, 40:].any() and not idx[2].any()


def test_index_rises_towards_a_reuse_peak_and_falls_after_it() -> None:
    """Reuse only in bucket k (think time): a life just before the peak is worth more than a
    fresh one (so the policy evicts fresh spans first), and a life past it is worth nothing."""
    k = age_bucket(400)
    h = np.zeros((1, NB))
    h[0, k] = 0.5
    idx = gittins_index(h, NB - 1)[0]
    assert all(idx[b] < idx[b + 1] for b in range(k))
    assert idx[k + 1 :].max() == 0.0 and idx[0] > 0


def test_refit_happens_at_fixed_ticks_however_often_advance_is_called() -> None:
    lazy, eager = table(period=64, decay=0.5), table(period=64, decay=0.5)
    rng = random.Random(2)
    for tick in range(1, 3000):
        eager.advance(tick)
        if rng.random() < 0.1:
            lazy.advance(tick)
            for tb in (lazy, eager):
                tb.birth(0, 3, tick)
            if tick > 50:
                for tb in (lazy, eager):
                    tb.end(0, tick - 40, 0, tick, True)
    lazy.advance(2999)
    assert lazy.refits == eager.refits == 2999 // 64
    assert lazy.index == eager.index
    np.testing.assert_array_equal(lazy.risk, eager.risk)


def test_sparse_classes_back_off_to_their_group_then_to_all() -> None:
    t = LifeTable([0, 0, 1, 2], period=1 << 40, decay=1.0, prior=10.0)
    t.risk[0, :3] = t.risk[2, :3] = 1000.0
    t.reuse[0, 2], t.reuse[2, 2] = 500.0, 100.0  # classes 1 (group 0) and 3: no data
    h = t.hazards()
    assert h[0, 2] == pytest.approx(0.5, abs=0.01) and h[2, 2] == pytest.approx(0.1, abs=0.01)
    assert h[1, 2] == pytest.approx(h[0, 2], abs=0.01)  # borrows its group's estimate
    assert h[3, 2] == pytest.approx(0.3, abs=0.01)  # its group is empty: the pooled hazard
    assert not h[:, 3:].any()  # no life reached those ages


# ---------------------------------------------------------------- the policy in the tree


def test_density_is_registered_and_constructible_by_name() -> None:
    assert "density" in available_policies()
    cache = RadixCache(page_size=4, policy="density")
    assert isinstance(cache.policy, DensityPolicy)


def test_untrained_density_evicts_the_oldest_life_first() -> None:
    """Before the first refit every index is 0, so ties go by birth tick: LRU."""
    cache = RadixCache(policy="density")
    for first, base in ((10, 100), (20, 200), (30, 300)):
        toks = list(range(first, first + 4))
        cache.insert(toks, np.arange(base, base + 4))
    cache.match([10, 11, 12, 13])
    order = [int(cache.evict(4)[0]) // 100 for _ in range(3)]
    assert order == [2, 3, 1]
    cache.check_integrity()


def _cyclic(policy: Any, rounds: int = 40, convs: int = 24, length: int = 8) -> list[int]:
    """`convs` conversations visited round-robin, the cache holding half of them: the
    textbook case where LRU never hits. Hits per round."""
    cache = RadixCache(page_size=4, policy=policy)
    cap = convs * length // 2
    hits, slot = [], 0
    for _ in range(rounds):
        got = 0
        for c in range(convs):
            toks = [c * 1000 + i for i in range(length)]
            got += cache.match(toks).length
            cache.insert(toks, np.arange(slot, slot + length))
            slot += length
            if cache.total_size > cap:
                cache.evict(cache.total_size - cap)
        hits.append(got)
        cache.check_integrity()
    return hits


def test_density_learns_to_hold_conversations_that_come_back_and_lru_cannot() -> None:
    assert sum(_cyclic("lru")) == 0
    learned = _cyclic(DensityPolicy(period=64, granule=4))
    per_round = 24 * 8
    assert sum(learned[-10:]) >= 0.3 * 10 * per_round  # a stable half is kept and hit


def test_a_ghost_reinserted_counts_as_a_reuse_of_the_evicted_life() -> None:
    cache = RadixCache(page_size=4, policy=DensityPolicy(granule=4))
    pol = cache.policy
    assert isinstance(pol, DensityPolicy)
    toks = list(range(100, 112))
    cache.insert(toks, np.arange(12))
    assert len(cache.evict(12)) == 12
    assert pol.table.reuse.sum() == 0 and pol.table.live_tokens() == 12  # ghosts live on
    cache.insert(toks, np.arange(12, 24))
    (node,) = [n for _, n in cache.iter_nodes()]
    assert node.gap == 1 and pol.table.reuse.sum() == 12
    cache.check_integrity()


def test_reset_forgets_running_lives_and_ghosts() -> None:
    cache = RadixCache(page_size=4, policy=DensityPolicy(granule=4))
    cache.insert(list(range(16)), np.arange(16))
    cache.evict(8)
    cache.reset()
    pol = cache.policy
    assert isinstance(pol, DensityPolicy)
    assert pol.table.live_tokens() == 0 and not pol._ghosts
    cache.insert(list(range(8)), np.arange(8))
    cache.check_integrity()


def test_eviction_samples_a_constant_number_of_leaves() -> None:
    pol = DensityPolicy(samples=8)
    calls = 0
    rank = pol.rank

    def counting(node: Any) -> tuple[float, int]:
        nonlocal calls
        calls += 1
        return rank(node)

    pol.rank = counting  # type: ignore[method-assign]
    cache = RadixCache(page_size=2, policy=pol)
    for i in range(500):
        toks = [7, 7, i, i]
        cache.insert(toks, np.arange(4 * i, 4 * i + 4))
    calls = 0
    for _ in range(50):
        assert len(cache.evict(2)) == 2
    assert calls == 50 * 8
    cache.check_integrity()


def test_same_stream_same_evictions() -> None:
    def run() -> list[int]:
        cache = RadixCache(page_size=2, policy=DensityPolicy(period=16, samples=4, granule=2))
        rng = random.Random(9)
        out: list[int] = []
        for i in range(400):
            toks = [rng.randrange(6) for _ in range(2)] + [i] * rng.randrange(2, 6)
            cache.match(toks)
            cache.insert(toks, np.arange(10 * i, 10 * i + len(toks)))
            out.extend(cache.evict(3).tolist())
        return out

    assert run() == run()


@pytest.mark.parametrize(("x", "want"), [(0, 0), (3, 0), (4, 1), (15, 1), (16, 2), (10**9, 6)])
def test_log4_bucket(x: int, want: int) -> None:
    assert log4_bucket(x, 7) == want

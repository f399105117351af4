"""The live regret window's costs on the engine thread: vectorized page keys against a plain
per-page reference, Belady as a resumable job (same result however it is sliced), and the
window's periodic replay spread over `advance` calls."""

from __future__ import annotations

import random

import numpy as np
import pytest

from radixkv.cache.policies.research.belady import (
    _MASK,
    _mix,
    belady,
    belady_steps,
    page_keys,
    page_keys_array,
)
from radixkv.cache.policies.research.regret import RegretWindow

_B = 0x9E3779B97F4A7C15


def _mix_int(x: int) -> int:
    return int(_mix(np.array([x], dtype=np.uint64))[0])


def reference_keys(tokens: list[int], page_size: int, seed: int) -> list[int]:
    """The chain one page at a time in Python ints: H_j = H_(j-1) * B + v_j (mod 2**64), v_j the
    page's tokens (each mixed with its position) as a polynomial in B; key j = mix(H_j)."""
    out, h = [], seed
    for start in range(0, len(tokens) - len(tokens) % page_size, page_size):
        v = 0
        for pos in range(start, start + page_size):
            t = _mix_int(tokens[pos] ^ _mix_int((pos + 0x632BE59BD9B4E019) & _MASK))
            v = (v * _B + t) & _MASK
        h = (h * _B + v) & _MASK
        out.append(_mix_int(h))
    return out


@pytest.mark.parametrize("page_size", [1, 3, 16])
def test_vectorized_keys_equal_the_per_page_chain(page_size: int) -> None:
    rng = np.random.default_rng(page_size)
    toks = rng.integers(0, 50_000, 200).tolist()
    seed = hash(("radixkv-page-keys", None)) & _MASK
    assert page_keys(toks, page_size) == reference_keys(toks, page_size, seed)
    assert page_keys_array(toks, page_size).tolist() == page_keys(toks, page_size)
    assert page_keys(toks[: page_size - 1], page_size) == []


def test_keys_of_structured_strings_do_not_collide() -> None:
    """A Thue-Morse string and its complement collide under a plain polynomial hash modulo
    2**64 from length 1,024 on; mixing each token with its position keeps them apart."""
    tm = np.array([bin(i).count("1") % 2 for i in range(4096)], dtype=np.int64)
    a, b = page_keys(tm + 1, 1), page_keys(2 - tm, 1)
    assert not set(a) & set(b)
    assert len(set(a)) == len(a)


def _trace(seed: int, n: int) -> list[list[int]]:
    """Requests as page keys: each extends a random prefix of an earlier one."""
    rng = random.Random(seed)
    out: list[list[int]] = []
    fresh = 0
    for _ in range(n):
        base = list(rng.choice(out)[: rng.randint(0, 30)]) if out and rng.random() < 0.7 else []
        ext = list(range(fresh, fresh + rng.randint(1, 40)))
        fresh += len(ext)
        out.append(base + ext)
    return out


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_sliced_belady_equals_the_whole_replay(chunk: int) -> None:
    for seed in range(6):
        trace = _trace(seed, 60)
        for cap in (0, 10, 80, 10_000):
            job, pauses = belady_steps(trace, cap, chunk), 0
            while True:
                try:
                    next(job)
                    pauses += 1
                except StopIteration as stop:
                    sliced = stop.value
                    break
            whole = belady(trace, cap)
            assert sliced == whole
            assert pauses >= sum(map(len, trace)) // chunk  # it did pause
    rows = [np.array(r, dtype=np.uint64) for r in _trace(9, 40)]  # array rows: the same
    assert belady(rows, 50) == belady([r.tolist() for r in rows], 50)


def test_the_periodic_replay_runs_in_slices() -> None:
    rng = np.random.default_rng(0)
    prefixes = [rng.integers(0, 1000, 300) for _ in range(4)]
    w = RegretWindow(page_size=1, capacity_tokens=900, every=8, slice_s=0.0)
    reqs = [np.concatenate([prefixes[i % 4], rng.integers(0, 1000, 200)]) for i in range(8)]
    for i, r in enumerate(reqs):
        w.record(r, None, len(r), 300 if i >= 4 else 0)
    assert w.replaying and w.last.requests == 0  # started, one tiny slice so far
    steps = 0
    while w.replaying:
        w.advance(0.0)  # one pause's worth of work per call
        steps += 1
    assert steps > 1 and w.last.requests == 8
    sliced = w.last
    whole = RegretWindow(page_size=1, capacity_tokens=900, every=1000)
    for i, r in enumerate(reqs):
        whole.record(r, None, len(r), 300 if i >= 4 else 0)
    assert whole.compute() == sliced  # the same window replayed whole
    assert w.current and w.compute() == sliced
    assert sliced.live_hit_rate == 4 * 300 / 4000 and 0 < sliced.belady_hit_rate <= 1


def test_compute_replays_only_what_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle poller pays one replay: `compute` returns the last report while nothing was
    recorded since, and replays again after a record."""
    import radixkv.cache.policies.research.regret as regret

    calls: list[int] = []
    real = regret.belady

    def counting(keys: list[np.ndarray], capacity: int) -> object:
        calls.append(len(keys))
        return real(keys, capacity)

    monkeypatch.setattr(regret, "belady", counting)
    w = RegretWindow(page_size=4, capacity_tokens=64, every=1000)
    assert w.current and w.compute().requests == 0 and calls == []
    w.record(np.arange(40), None, 40, 0)
    assert not w.current
    first = w.compute()
    assert first.requests == 1 and calls == [1]
    assert w.current and w.compute() is first and calls == [1]
    w.record(np.arange(40), None, 40, 36)
    assert w.compute().requests == 2 and calls == [1, 2]

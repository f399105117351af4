"""Hybrid models (SWA windows, STATE checkpoints) in the host (L2) and storage (L3) tiers, over
the toy hybrid model (whose SWA layers raise on a freed slot and whose STATE layers read exactly
the slot they are handed): a restarted engine finds its prefixes in L3, a diverging prompt
resumes at a boundary every component accepts, corrupt or missing component values are misses,
outputs equal full recomputation, and every pool's census (device and host, per component)
balances after every step (`run_checked`)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import make_engine, run_checked
from engine_toy_hybrid import ToyHybridConfig, ToyHybridLM, reference_greedy_hybrid

from radixkv.cache.hybrid.tier_vote import deepest_boundary, tier_boundaries
from radixkv.engine.engine import Engine
from radixkv.engine.types import SamplingParams

KINDS = {
    "full+swa": ("full", "swa", "swa"),  # Gemma 3-like
    "full+state": ("full", "state"),  # Qwen3.5 / LFM2-like
    "full+swa+state": ("full", "swa", "state", "swa"),
}
SP = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
_LM: dict[str, ToyHybridLM] = {}
_REF: dict[tuple[str, int], list[int]] = {}


def _lm(kinds: str) -> ToyHybridLM:
    if kinds not in _LM:
        _LM[kinds] = ToyHybridLM(ToyHybridConfig(kinds=KINDS[kinds], window=8))
    return _LM[kinds]


def _prompts(seed: int = 0) -> tuple[list[int], list[int]]:
    """A 300-token prompt and one that diverges from it at token 200."""
    rng = random.Random(seed)
    base = [rng.randrange(38) for _ in range(300)]
    return base, base[:200] + [rng.randrange(38) for _ in range(60)]


def _want(kinds: str, prompt: list[int]) -> list[int]:
    key = (kinds, hash(tuple(prompt)))
    if key not in _REF:
        _REF[key] = reference_greedy_hybrid(_lm(kinds), prompt, SP.max_tokens)
    return _REF[key]


def _engine(kinds: str, tmp: Path | None, **kw: Any) -> Engine:
    args: dict[str, Any] = {
        "page_size": 4,
        "chunked_prefill_size": 64,
        "state_checkpoint_interval": 32,
        "enable_hierarchical_cache": True,
    }
    if tmp is not None:
        args.update(hicache_storage_backend="file", hicache_storage_url=str(tmp / "l3"))
    args.update(kw)
    return make_engine(_lm(kinds), **args)


def _run(e: Engine, kinds: str, prompt: list[int]) -> int:
    """Run one prompt (census checked every step); its output must equal recomputation.
    Returns its cached prompt tokens."""
    before = e.metrics().cached_prompt_tokens_total
    (out,) = run_checked(e, [prompt], SP)
    assert out.output_token_ids == _want(kinds, prompt)
    return e.metrics().cached_prompt_tokens_total - before


def _files(tmp: Path, suffix: str) -> list[Path]:
    return sorted(p for p in (tmp / "l3").rglob(f"*{suffix}") if p.is_file())


@pytest.mark.parametrize("policy", ["wait_complete", "cost_aware"])
@pytest.mark.parametrize("kinds", list(KINDS))
def test_restart_finds_hybrid_prefixes_in_storage(tmp_path: Path, kinds: str, policy: str) -> None:
    base, diverging = _prompts()
    a = _engine(kinds, tmp_path, hicache_storage_prefetch_policy=policy)
    assert _run(a, kinds, base) == 0
    assert a.close()
    if "swa" in kinds:
        assert _files(tmp_path, "-swa")
    if "state" in kinds:
        assert _files(tmp_path, "-state")
    b = _engine(kinds, tmp_path, hicache_storage_prefetch_policy=policy)  # empty tree and L2
    assert _run(b, kinds, base) >= 0.9 * len(base)
    assert b.metrics().cached_tokens_by_tier["storage"] >= 0.9 * len(base)
    b.close()
    c = _engine(kinds, tmp_path, hicache_storage_prefetch_policy=policy)
    assert _run(c, kinds, diverging) >= 100  # resumes at a kept boundary <= 200, past half
    c.close()


@pytest.mark.parametrize("kinds", list(KINDS))
def test_corrupt_component_values_are_misses(tmp_path: Path, kinds: str) -> None:
    base, _ = _prompts(1)
    a = _engine(kinds, tmp_path, hicache_storage_prefetch_policy="wait_complete")
    assert _run(a, kinds, base) == 0 and a.close()
    comp = "-state" if "state" in kinds else "-swa"
    files = _files(tmp_path, comp)
    assert files
    for f in files:  # one flipped byte in every value of that component
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
    b = _engine(kinds, tmp_path, hicache_storage_prefetch_policy="wait_complete")
    assert _run(b, kinds, base) == 0  # FULL pages alone cannot resume: recomputed
    assert b.metrics().tier_stats["storage_corrupt"] > 0
    b.close()


def test_missing_checkpoints_fall_back_to_shallower_boundaries(tmp_path: Path) -> None:
    kinds = "full+state"
    base, _ = _prompts(2)
    a = _engine(kinds, tmp_path, hicache_storage_prefetch_policy="wait_complete")
    assert _run(a, kinds, base) == 0 and a.close()
    states = _files(tmp_path, "-state")
    keep = min(states, key=lambda p: p.stat().st_mtime_ns)  # the first checkpoint written
    for f in states:
        if f != keep:
            f.unlink()
    b = _engine(kinds, tmp_path, hicache_storage_prefetch_policy="wait_complete")
    got = _run(b, kinds, base)
    assert 0 < got < 0.9 * len(base)  # only the remaining (shallow) checkpoint can be used
    b.close()


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
@pytest.mark.parametrize("kinds", list(KINDS))
def test_l1_evicted_prefix_comes_back_from_host(kinds: str, policy: str) -> None:
    base, diverging = _prompts(3)
    e = _engine(kinds, None, num_slots=384, swa_num_slots=384, hicache_write_policy=policy)
    assert _run(e, kinds, base) == 0
    rng = random.Random(9)
    for _ in range(2):  # other traffic evicts the prompt from the device pool (not from L2)
        _run(e, kinds, [rng.randrange(38) for _ in range(150)])
    host_before = e.metrics().cached_tokens_by_tier["host"]
    assert _run(e, kinds, base) >= 0.9 * len(base)
    assert e.metrics().cached_tokens_by_tier["host"] > host_before
    assert _run(e, kinds, diverging) >= 100
    stats = e.metrics().tier_stats
    for comp in ("swa", "state"):
        if f"host_{comp}_pool_pages" in stats:
            parts = (stats[f"host_{comp}_{k}_pages"] for k in ("free", "cached", "held"))
            assert sum(parts) == stats[f"host_{comp}_pool_pages"]


def test_kv_events_still_refuse_hybrids_with_tiers(tmp_path: Path) -> None:
    cfg = {"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:1", "topic": "t"}
    with pytest.raises(ValueError, match="hybrid"):
        _engine("full+swa", tmp_path, kv_events_config=json.dumps(cfg))


def _naive_boundary(
    start: int, run: int, wp: int | None, swa: set[int], state: set[int] | None
) -> int:
    best = start
    for b in range(start + 1, start + run + 1):
        ok = state is None or b in state
        if wp is not None:
            ok = ok and all(p in swa for p in range(max(start, b - wp), b))
        if ok:
            best = b
    return best


def test_tier_vote_matches_a_naive_scan() -> None:
    rng = random.Random(5)
    for _ in range(2000):
        start, run = rng.randrange(6), rng.randrange(12)
        wp = rng.choice([None, 1, 2, 3])
        swa = {p for p in range(20) if rng.random() < 0.7}
        state = rng.choice([None, {b for b in range(20) if rng.random() < 0.3}])
        got = deepest_boundary(
            start, run, wp, swa.__contains__, None if state is None else state.__contains__
        )
        assert got == _naive_boundary(start, run, wp, swa, state)


def test_tier_boundaries() -> None:
    assert tier_boundaries(0, 40, 4, 16) == [4, 8, 16, 32, 40]
    assert tier_boundaries(32, 40, 4, 16, extra=(36, 44)) == [36, 40]
    assert tier_boundaries(40, 40, 4, 16) == []


def test_restart_through_redis(redis_server: Any) -> None:
    """The Redis backend (MGET batches: each component key read alone after a miss)."""
    kinds = "full+swa+state"
    base, diverging = _prompts(4)
    tiers = {
        "hicache_storage_backend": "redis",
        "hicache_storage_url": redis_server.url,
        "hicache_storage_prefetch_policy": "wait_complete",
    }
    a = _engine(kinds, None, **tiers)
    assert _run(a, kinds, base) == 0 and a.close()
    b = _engine(kinds, None, **tiers)
    assert _run(b, kinds, base) >= 0.9 * len(base)
    assert _run(b, kinds, diverging) >= 100
    b.close()

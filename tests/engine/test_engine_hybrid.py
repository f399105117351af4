"""The engine over a toy hybrid model (FULL + SWA + STATE): outputs equal full recomputation
with the cache on and off, every pool's census holds after every step, SWA memory per request
stays near the window, and STATE checkpoints are placed where later requests reuse them."""

from __future__ import annotations

import random
from typing import Any

import pytest
from engine_helpers import GREEDY, make_engine, run_checked, shared_prefix_workload
from engine_toy_hybrid import ToyHybridConfig, ToyHybridLM, reference_greedy_hybrid
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.engine.types import SamplingParams
from radixkv.memory.hybrid import SWA

KINDS = {
    "swa-only": ("swa", "swa"),  # Mistral-like: FULL slots are bookkeeping, no FULL tensor
    "full+swa": ("full", "swa", "swa"),
    "full+state": ("full", "state"),
    "full+swa+state": ("full", "swa", "state", "swa"),
}


def hybrid_engine(kinds: tuple[str, ...], window: int = 8, **kw: Any) -> Any:
    lm = ToyHybridLM(ToyHybridConfig(kinds=kinds, window=window))
    return make_engine(lm, **kw), lm


@pytest.mark.parametrize("kinds", list(KINDS))
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("cache_off", [False, True])
def test_hybrid_greedy_matches_recomputation(kinds: str, page_size: int, cache_off: bool) -> None:
    engine, lm = hybrid_engine(
        KINDS[kinds],
        page_size=page_size,
        disable_radix_cache=cache_off,
        chunked_prefill_size=16,
        state_checkpoint_interval=8,
    )
    prompts = shared_prefix_workload(seed=3)
    sp = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outs = run_checked(engine, prompts, sp)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.output_token_ids == reference_greedy_hybrid(lm, prompt, 6)
    m = engine.metrics()
    assert set(m.component_pools) >= {"full"}
    if not cache_off:
        assert m.cached_prompt_tokens_total > 0
    engine.flush_cache()
    engine.check_memory()
    for name, row in engine.metrics().component_pools.items():
        assert row["held"] == 0 and row["cached"] == 0, name


def test_long_request_holds_about_a_window_of_swa() -> None:
    window, ps = 8, 4
    engine, lm = hybrid_engine(
        ("full", "swa"), window=window, page_size=ps, chunked_prefill_size=16
    )
    rng = random.Random(0)
    prompt = [rng.randrange(38) for _ in range(60)]
    rid = engine.add_request(
        prompt, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    )
    out: list[int] = []
    peak = 0
    while engine.has_unfinished():
        for d in engine.step():
            out.extend(d.new_token_ids)
        engine.check_memory()
        for r in engine.scheduler.running:
            peak = max(peak, len(r.kv_kinds[SWA].pages) * ps)
    assert rid and out == reference_greedy_hybrid(lm, prompt, 40)
    assert peak <= window + 16 + 2 * ps  # the window, one prefill chunk, two partial pages


def test_small_swa_pool_trims_and_evicts_but_stays_exact() -> None:
    engine, lm = hybrid_engine(
        ("full", "swa", "state"),
        window=4,
        page_size=2,
        chunked_prefill_size=8,
        swa_num_slots=40,
        state_num_slots=12,
        state_checkpoint_interval=4,
        max_running_requests=2,
    )
    prompts = shared_prefix_workload(seed=5)
    outs = run_checked(engine, prompts, GREEDY)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.output_token_ids == reference_greedy_hybrid(lm, prompt, GREEDY.max_tokens)


def test_checkpoints_reuse_shared_prompt_and_divergence() -> None:
    engine, lm = hybrid_engine(
        ("full", "state"), page_size=16, chunked_prefill_size=128, state_checkpoint_interval=256
    )
    rng = random.Random(1)
    base = [rng.randrange(38) for _ in range(700)]
    sp = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    first = base + [rng.randrange(38) for _ in range(300)]
    second = base + [rng.randrange(38) for _ in range(50)]
    third = base + [rng.randrange(38) for _ in range(50)]
    cached = []
    for prompt in (first, second, third):
        rid = engine.add_request(prompt, sp)
        got: list[int] = []
        while engine.has_unfinished():
            for d in engine.step():
                got.extend(d.new_token_ids)
                if d.finished:
                    cached.append(d.cached_tokens)
            engine.check_memory()
        assert rid and got == reference_greedy_hybrid(lm, prompt, 2)
    shared = 700 // 16 * 16
    assert cached[0] == 0
    assert cached[1] >= 512 and cached[1] >= 700 // 2  # the last interval checkpoint
    assert cached[2] == shared  # the checkpoint the second request left at the divergence


_HLMS: dict[tuple[str, ...], ToyHybridLM] = {}


def _hybrid_lm(kinds: tuple[str, ...], window: int) -> ToyHybridLM:
    key = (*kinds, str(window))
    if key not in _HLMS:
        _HLMS[key] = ToyHybridLM(ToyHybridConfig(kinds=kinds, window=window))
    return _HLMS[key]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_random_hybrid_workloads_tight_pools(seed: int) -> None:
    """Random branching prompts, tight pools of every component (eviction, trimming, dropped
    checkpoints, retraction), random page size / chunk / interval: outputs equal recomputation
    and every pool's census holds after every step."""
    rng = random.Random(seed)
    kinds = rng.choice(list(KINDS.values()))
    window = rng.choice([2, 4, 8])
    ps = rng.choice([1, 2, 4])
    chunk = rng.choice([4, 8, 16])
    roots = [[rng.randrange(38) for _ in range(rng.randrange(1, 30))] for _ in range(2)]
    prompts: list[list[int]] = []
    for _ in range(rng.randrange(3, 8)):
        base = rng.choice(roots + prompts)
        cut = rng.randrange(0, len(base) + 1)
        prompts.append(base[:cut] + [rng.randrange(38) for _ in range(rng.randrange(1, 20))])
    max_tokens = [rng.randrange(1, 8) for _ in prompts]
    longest = max(len(p) + m for p, m in zip(prompts, max_tokens, strict=True))
    full = -(-longest // ps) * ps + rng.randrange(0, 60)
    least_swa = -(-(window + chunk) // ps) * ps + 2 * ps
    lm = _hybrid_lm(kinds, window)
    engine = make_engine(
        lm,
        page_size=ps,
        num_slots=full,
        swa_num_slots=least_swa + rng.randrange(0, 40),
        state_num_slots=rng.randrange(3, 12),
        state_checkpoint_interval=rng.choice([ps, 4, 8, 16]),
        chunked_prefill_size=chunk,
        max_running_requests=rng.choice([1, 2, 4]),
        disable_radix_cache=rng.random() < 0.15,
        eviction_policy=rng.choice(["lru", "lfu", "fifo", "priority"]),
    )
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in max_tokens]
    outs = run_checked(engine, prompts, params)
    for p, m, o in zip(prompts, max_tokens, outs, strict=True):
        assert o.output_token_ids == reference_greedy_hybrid(lm, p, m)
    engine.flush_cache()
    engine.check_memory()


def test_hybrid_config_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="radix"):
        hybrid_engine(KINDS["full+swa"], cache="blockhash")
    with pytest.raises(ValueError, match="SWA pool"):
        hybrid_engine(KINDS["full+swa"], swa_num_slots=8)
    with pytest.raises(ValueError, match="interval"):
        hybrid_engine(KINDS["full+state"], state_checkpoint_interval=0)
    # Hybrids with FULL layers keep every component in the tiers (tests/tiers/
    # test_tiers_hybrid.py); a model without FULL layers has no pages to key them by.
    with pytest.raises(ValueError, match="full-attention"):
        hybrid_engine(KINDS["swa-only"], enable_hierarchical_cache=True)


@pytest.mark.parametrize("kinds", ["full+swa+state", "swa-only", "full+state"])
@pytest.mark.parametrize("cache_off", [False, True])
@pytest.mark.parametrize("plen", [30, 33])
def test_hybrid_n_choices_fork_from_one_prefill(kinds: str, cache_off: bool, plen: int) -> None:
    """n > 1 on a hybrid model: the prompt is computed once and the other choices fork from it
    (the parent's SWA K/V and working state copied); greedy choices equal the reference, sampled
    ones equal the same choices admitted one by one (no fork: one running request at a time)."""
    rng = random.Random(plen)
    prompt = [rng.randrange(38) for _ in range(plen)]  # past the window of 8; a partial page
    outs = {}
    for forking in (True, False):
        engine, lm = hybrid_engine(
            KINDS[kinds],
            page_size=4,
            disable_radix_cache=cache_off,
            state_checkpoint_interval=8,
            chunked_prefill_size=16,
            max_running_requests=4 if forking else 1,
        )
        got: dict[tuple[int, int], list[int]] = {}
        for sp in (
            SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, n=3),
            SamplingParams(max_tokens=5, temperature=2.0, ignore_eos=True, n=3, seed=5),
        ):
            rid = engine.add_request(prompt, sp)
            while engine.has_unfinished():
                for d in engine.step():
                    assert d.request_id == rid
                    got.setdefault((sp.n if sp.greedy else 4, d.index), []).extend(d.new_token_ids)
                engine.check_memory()
        want = reference_greedy_hybrid(lm, prompt, 5)
        assert [got[(3, i)] for i in range(3)] == [want] * 3
        forked = engine.metrics().forked_choices_total
        assert forked == (4 if forking else 0)
        if forking:  # the prompt was computed once per request, not once per choice
            assert engine.scheduler.prefill_tokens_total <= 2 * plen
        engine.flush_cache()
        engine.check_memory()
        outs[forking] = got
    assert outs[True] == outs[False]


@pytest.mark.parametrize("shared", [40, 130, 300])
def test_resume_past_half_of_a_short_shared_prefix(shared: int) -> None:
    """Even with an interval longer than the shared prefix, power-of-two checkpoints let the
    second request resume at more than half of it."""
    engine, lm = hybrid_engine(
        ("full", "state"), page_size=4, chunked_prefill_size=512, state_checkpoint_interval=1024
    )
    rng = random.Random(shared)
    base = [rng.randrange(38) for _ in range(shared)]
    sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    first = engine.generate(base + [rng.randrange(38) for _ in range(60)], sp)[0]
    second_prompt = base + [rng.randrange(38) for _ in range(9)]
    second = engine.generate(second_prompt, sp)[0]
    engine.check_memory()
    assert first.cached_tokens == 0
    assert second.cached_tokens > (shared // 4 * 4) / 2
    assert second.output_token_ids == reference_greedy_hybrid(lm, second_prompt, 1)


def test_next_turn_resumes_at_the_previous_prompt_end() -> None:
    """A conversation's next turn rewrites the answer: the checkpoint at the last page
    boundary of the previous prompt is where it resumes."""
    engine, lm = hybrid_engine(
        ("full", "swa", "state"),
        page_size=4,
        chunked_prefill_size=512,
        state_checkpoint_interval=1024,
    )
    rng = random.Random(11)
    turn1 = [rng.randrange(38) for _ in range(50)]
    sp = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    engine.generate(turn1, sp)
    turn2 = turn1 + [rng.randrange(38) for _ in range(15)]  # a different answer + question
    out = engine.generate(turn2, sp)[0]
    engine.check_memory()
    assert out.cached_tokens == 48
    assert out.output_token_ids == reference_greedy_hybrid(lm, turn2, 3)


@pytest.mark.parametrize("window,chunk,ps", [(32, 16, 4), (16, 8, 2)])
def test_part_of_a_conversation_resumes_at_the_least_swa_pool(
    window: int, chunk: int, ps: int
) -> None:
    """At the least SWA pool (window + one chunk + 2 pages) a prompt sharing ~1.2 windows of an
    earlier ~1.4-window one resumes past the window: trimming under pressure frees the SWA
    pages furthest back first and only as many as asked, so the window before the shared
    part survives (it used to tombstone every out-of-window page of the chain at once)."""
    engine, lm = hybrid_engine(
        ("full", "swa"),
        window=window,
        page_size=ps,
        chunked_prefill_size=chunk,
        swa_num_slots=window + chunk + 2 * ps,
        max_running_requests=2,
    )
    rng = random.Random(window)
    sp = SamplingParams(max_tokens=window // 16 + 2, temperature=0.0, ignore_eos=True)
    short = [[rng.randrange(38) for _ in range(5)], [rng.randrange(38) for _ in range(9)]]
    long_a = [rng.randrange(38) for _ in range(window * 11 // 8)]
    shared = window * 19 // 16
    long_b = long_a[:shared] + [rng.randrange(38) for _ in range(5)]
    cached = []
    for prompt in [*short, long_a, long_b]:
        (out,) = engine.generate([prompt], sp)
        engine.check_memory()
        assert out.output_token_ids == reference_greedy_hybrid(lm, prompt, sp.max_tokens)
        cached.append(out.cached_tokens)
    assert cached[3] == shared // ps * ps > window

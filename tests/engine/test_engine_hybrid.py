"""The engine over a toy hybrid model (FULL + SWA + STATE): outputs equal full recomputation
with the cache on and off, every pool's census holds after every step, SWA memory per request
stays near the window, and STATE checkpoints are placed where later requests reuse them."""

from __future__ import annotations

import random
from typing import Any

import pytest
from engine_helpers import GREEDY, make_engine, run_checked, shared_prefix_workload
from engine_toy_hybrid import ToyHybridConfig, ToyHybridLM, reference_greedy_hybrid

from radixkv.engine.types import SamplingParams

KINDS = {
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
            peak = max(peak, len(r.swa_pages) * ps)
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

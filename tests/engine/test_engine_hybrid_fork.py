"""n > 1 on hybrid models under memory pressure: random branching prompts with 1-3 greedy choices
each, tight FULL / SWA / STATE pools (forks that fail fall back to admission, eviction, trimming,
retraction): every choice equals full recomputation and every pool's census holds after every
step."""

from __future__ import annotations

import random

from engine_helpers import make_engine
from engine_toy_hybrid import ToyHybridConfig, ToyHybridLM, reference_greedy_hybrid
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.engine.types import SamplingParams

KINDS = [("swa", "swa"), ("full", "swa", "swa"), ("full", "state"), ("full", "swa", "state", "swa")]
_LMS: dict[tuple[str, ...], ToyHybridLM] = {}


def _lm(kinds: tuple[str, ...], window: int) -> ToyHybridLM:
    key = (*kinds, str(window))
    if key not in _LMS:
        _LMS[key] = ToyHybridLM(ToyHybridConfig(kinds=kinds, window=window))
    return _LMS[key]


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_random_hybrid_choices_fork_exactly_in_tight_pools(seed: int) -> None:
    rng = random.Random(seed)
    kinds = rng.choice(KINDS)
    window = rng.choice([2, 4, 8])
    ps = rng.choice([1, 2, 4])
    chunk = rng.choice([4, 8, 16])
    base = [rng.randrange(38) for _ in range(rng.randrange(1, 30))]
    prompts = [
        base[: rng.randrange(0, len(base) + 1)]
        + [rng.randrange(38) for _ in range(rng.randrange(1, 20))]
        for _ in range(rng.randrange(2, 6))
    ]
    params = [
        SamplingParams(
            max_tokens=rng.randrange(1, 7), temperature=0.0, ignore_eos=True, n=rng.randrange(1, 4)
        )
        for _ in prompts
    ]
    longest = max(len(p) + sp.max_tokens for p, sp in zip(prompts, params, strict=True))
    lm = _lm(kinds, window)
    engine = make_engine(
        lm,
        page_size=ps,
        num_slots=-(-longest // ps) * ps + rng.randrange(0, 80),
        swa_num_slots=-(-(window + chunk) // ps) * ps + 2 * ps + rng.randrange(0, 40),
        state_num_slots=rng.randrange(3, 12),
        state_checkpoint_interval=rng.choice([ps, 4, 8]),
        chunked_prefill_size=chunk,
        max_running_requests=rng.choice([1, 2, 4]),
        disable_radix_cache=rng.random() < 0.2,
    )
    rids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    got: dict[tuple[str, int], list[int]] = {}
    steps = 0
    while engine.has_unfinished():
        for d in engine.step():
            got.setdefault((d.request_id, d.index), []).extend(d.new_token_ids)
        engine.check_memory()
        steps += 1
        assert steps < 10_000
    for rid, p, sp in zip(rids, prompts, params, strict=True):
        want = reference_greedy_hybrid(lm, p, sp.max_tokens)
        assert [got[(rid, i)] for i in range(sp.n)] == [want] * sp.n
    engine.flush_cache()
    engine.check_memory()

"""Only a step's first prefill may be cut short by the chunk budget: a later prompt that does not
fit whole starts next step. Uncached prompts arriving together then get their first tokens one
after another instead of all at the end of a shared step.

Time is virtual: each step costs the tokens it computes, so the figures are machine-independent.
"""

from __future__ import annotations

import random

from engine_helpers import make_engine

from radixkv.engine.engine import Engine
from radixkv.engine.scheduler import ScheduledBatch
from radixkv.engine.types import SamplingParams

GREEDY = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


def _run(engine: Engine, prompts: list[list[int]]) -> tuple[dict[str, int], list[list[int]]]:
    """Step to completion; (virtual time of each request's first token, per-step extend
    lengths of the prefill rows)."""
    steps: list[list[int]] = []
    schedule = engine.scheduler.schedule

    def spy() -> ScheduledBatch:
        batch = schedule()
        steps.append([n for n in batch.extend_lens if n > 1])
        clock[0] += batch.num_tokens
        return batch

    clock = [0]
    engine.scheduler.schedule = spy  # type: ignore[method-assign]
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    first: dict[str, int] = {}
    while engine.has_unfinished():
        for d in engine.step():
            if d.new_token_ids and d.request_id not in first:
                first[d.request_id] = clock[0]
        engine.check_memory()
    assert set(first) == set(ids)
    return {i: first[i] for i in ids}, steps


def _rand(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(38) for _ in range(n)]


def test_cold_prompts_arriving_together_finish_one_after_another() -> None:
    rng = random.Random(1)
    eng = make_engine(chunked_prefill_size=64, page_size=4)
    ttft, steps = _run(eng, [_rand(rng, 40) for _ in range(3)])
    assert steps[:3] == [[40], [40], [40]]  # never a partial second chunk
    got = sorted(ttft.values())
    assert got == [40, 81, 123]  # each step: one prefill + the decodes already running
    # Filling the budget (40 + 24 partial, then 16 + 40) would give 64, 120 and 120: the mean
    # time to first token is lower by a fifth, the last one is no later.
    assert sum(got) / 3 < (64 + 120 + 120) / 3 * 0.85
    assert max(got) <= 123


def test_a_prompt_longer_than_the_budget_is_chunked_and_smaller_ones_follow() -> None:
    rng = random.Random(2)
    eng = make_engine(chunked_prefill_size=64, page_size=4)
    ttft, steps = _run(eng, [_rand(rng, 150), _rand(rng, 10), _rand(rng, 10)])
    # The long prompt is the first prefill of three steps; the small ones fill its last step.
    assert steps[:3] == [[64], [64], [22, 10, 10]]
    assert list(ttft.values()) == [170, 170, 170]


def test_a_cached_prompt_is_charged_only_its_uncached_tail() -> None:
    rng = random.Random(3)
    eng = make_engine(chunked_prefill_size=64, page_size=4)
    system = _rand(rng, 48)
    _run(eng, [system + _rand(rng, 4)])  # the 48-token prefix is now cached
    _, steps = _run(eng, [_rand(rng, 40), system + _rand(rng, 8)])
    # 40 cold + 8 uncached (of 56) fit one budget of 64: both start in the first step.
    assert sorted(steps[0]) == [8, 40]


def test_every_request_is_served_under_random_mixes() -> None:
    """No prompt starves behind smaller ones: random lengths around the budget all finish."""
    rng = random.Random(4)
    for _ in range(5):
        eng = make_engine(chunked_prefill_size=48, page_size=4, max_running_requests=4)
        prompts = [_rand(rng, rng.randrange(2, 130)) for _ in range(12)]
        ttft, steps = _run(eng, prompts)
        assert len(ttft) == len(prompts)
        for s in steps:
            assert sum(s) <= 48
            # At most one prefill per step is cut short by the budget, and only the first.
            assert all(n <= 48 for n in s)

"""decode_stall_ms: while a request decodes, a long prompt is spread over steps of about that
much prefill time, and each of those steps also advances the decoding streams; while none
decodes, a step stops taking further prompts once it holds that much prefill.

The prefill rate is pinned (the engine's measurement of it is replaced) so the chunking is
machine-independent; the measurement itself is tested on its own.
"""

from __future__ import annotations

import random

import pytest
from engine_helpers import make_engine, run_checked

from radixkv.engine.engine import Engine
from radixkv.engine.scheduler import ScheduledBatch
from radixkv.engine.types import SamplingParams

DECODE = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def _rand(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(38) for _ in range(n)]


def _pinned(stall_ms: float, rate: float, **kw: object) -> Engine:
    eng = make_engine(chunked_prefill_size=512, page_size=4, decode_stall_ms=stall_ms, **kw)
    eng.scheduler.prefill_rate = rate
    eng.scheduler.observe_step = lambda batch, forward_s: None  # type: ignore[method-assign]
    return eng


def _steps_with_late_prompt(eng: Engine, late: list[int]) -> tuple[list[list[int]], list[int]]:
    """One request decodes; after its first token a long prompt arrives. Returns each later
    step's extend lengths, and the decoding request's tokens per step."""
    rng = random.Random(7)
    first = eng.add_request(_rand(rng, 8), DECODE)
    while not any(d.new_token_ids for d in eng.step()):
        pass
    eng.add_request(late, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    steps: list[list[int]] = []
    decoded: list[int] = []
    schedule = eng.scheduler.schedule

    def spy() -> ScheduledBatch:
        batch = schedule()
        steps.append(list(batch.extend_lens))
        return batch

    eng.scheduler.schedule = spy  # type: ignore[method-assign]
    while eng.has_unfinished():
        got = sum(len(d.new_token_ids) for d in eng.step() if d.request_id == first)
        decoded.append(got)
        eng.check_memory()
    return steps, decoded


def test_off_a_long_prompt_takes_the_whole_budget_in_one_step() -> None:
    eng = _pinned(0.0, 1000.0)
    steps, decoded = _steps_with_late_prompt(eng, _rand(random.Random(1), 300))
    assert steps[0] == [1, 300]  # the decoding stream waits for the whole prompt
    assert decoded[0] == 1


def test_on_the_prompt_is_spread_and_every_step_advances_the_stream() -> None:
    # 1,000 prompt tokens/s and 100 ms: 100 tokens per step while the stream decodes.
    eng = _pinned(100.0, 1000.0)
    steps, decoded = _steps_with_late_prompt(eng, _rand(random.Random(1), 300))
    assert steps[:3] == [[1, 100], [1, 100], [1, 100]]
    assert decoded[:3] == [1, 1, 1]  # a token of the stream in each chunk's step


def test_the_cut_never_goes_below_the_floor() -> None:
    eng = _pinned(1.0, 1000.0)  # 1 token's worth: the floor applies
    steps, _ = _steps_with_late_prompt(eng, _rand(random.Random(2), 200))
    floor = eng.scheduler.min_stall_chunk
    assert steps[0] == [1, floor]


def test_without_decodes_the_whole_budget_is_used() -> None:
    eng = _pinned(100.0, 1000.0)
    rng = random.Random(3)
    eng.add_request(_rand(rng, 300), DECODE)
    batch = eng.scheduler.schedule()
    assert batch.extend_lens == [300]


def test_a_burst_stops_taking_prompts_at_the_stall_share() -> None:
    """Nothing decodes and six 60-token prompts wait: the step takes whole prompts until its
    prompt tokens reach the stall's share (100 tokens), not the whole 512 budget, so the first
    ones start decoding while the rest prefill; the first prompt always joins whole."""
    eng = _pinned(100.0, 1000.0)
    rng = random.Random(5)
    for _ in range(6):
        eng.add_request(_rand(rng, 60), DECODE)
    assert eng.scheduler.schedule().extend_lens == [60, 60]
    # The rest are not admitted ahead of their step (no locks, no reserve held for them).
    assert len(eng.scheduler.running) == 2 and len(eng.scheduler.waiting) == 4
    big = _pinned(100.0, 1000.0)
    big.add_request(_rand(rng, 300), DECODE)
    big.add_request(_rand(rng, 60), DECODE)
    assert big.scheduler.schedule().extend_lens == [300]  # alone past the share, but whole


def test_a_burst_takes_the_whole_budget_when_the_stall_is_off() -> None:
    eng = _pinned(0.0, 1000.0)
    rng = random.Random(5)
    for _ in range(6):
        eng.add_request(_rand(rng, 60), DECODE)
    assert eng.scheduler.schedule().extend_lens == [60] * 6


def test_unmeasured_rate_leaves_the_budget_whole() -> None:
    eng = _pinned(100.0, 0.0)
    steps, _ = _steps_with_late_prompt(eng, _rand(random.Random(4), 300))
    assert steps[0] == [1, 300]


def test_the_rate_is_an_average_of_prefill_steps_only() -> None:
    sched = make_engine(decode_stall_ms=100.0).scheduler
    big = ScheduledBatch()
    big.add(object(), 200)  # type: ignore[arg-type]
    small = ScheduledBatch()
    small.add(object(), 1)  # type: ignore[arg-type]
    small.add(object(), 10)  # type: ignore[arg-type]
    sched.observe_step(small, 0.001)  # too few prompt tokens: no information
    assert sched.prefill_rate == 0.0
    sched.observe_step(big, 0.1)  # the first measurement is taken whole
    assert sched.prefill_rate == pytest.approx(2000.0)
    sched.observe_step(big, 0.2)  # later ones are averaged in
    w = sched.rate_weight
    assert sched.prefill_rate == pytest.approx((1 - w) * 2000.0 + w * 1000.0)


@pytest.mark.parametrize("stall_ms", [0.0, 30.0])
def test_answers_are_the_same_whatever_the_stall(stall_ms: float) -> None:
    rng = random.Random(5)
    prompts = [_rand(rng, rng.randrange(20, 300)) for _ in range(8)]
    want = run_checked(_pinned(0.0, 1000.0, max_running_requests=3), prompts, DECODE)
    got = run_checked(_pinned(stall_ms, 1000.0, max_running_requests=3), prompts, DECODE)
    assert [o.output_token_ids for o in got] == [o.output_token_ids for o in want]

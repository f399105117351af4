"""n > 1: choices fork from one prefill. Against the no-cache reference decoder over the toy model
(which reads K/V only through the pool, so a wrong fork slot or copy changes the tokens), with
the census checked after every step, across page sizes, cache modes, row limits (fork fallback)
and memory pressure (retraction of forked choices)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from engine_helpers import CACHE_MODES, make_engine, reference_greedy
from engine_toy import ToyLM

from radixkv.engine.engine import Engine
from radixkv.engine.types import SamplingParams

LM = ToyLM()


def _run(
    engine: Engine, prompts: list[list[int]], sp: SamplingParams
) -> dict[tuple[str, int], list[int]]:
    """Step to completion checking the census; tokens per (request id, choice index)."""
    rids = [engine.add_request(p, sp) for p in prompts]
    out: dict[tuple[str, int], list[int]] = {(r, i): [] for r in rids for i in range(sp.n)}
    finished: set[str] = set()
    for _ in range(10_000):
        if not engine.has_unfinished():
            break
        for d in engine.step():
            out[(d.request_id, d.index)].extend(d.new_token_ids)
            if d.finished:
                assert d.request_id not in finished  # exactly one finished delta per request
                finished.add(d.request_id)
        engine.check_memory()
    assert finished == set(rids)
    return out


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(38) for _ in range(21)]
    return [shared + [rng.randrange(38) for _ in range(k)] for k in (2, 9, 0)]


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize(("cache", "disabled"), CACHE_MODES)
@pytest.mark.parametrize("max_running", [32, 2])
def test_greedy_choices_equal_reference(
    page_size: int, cache: str, disabled: bool, max_running: int
) -> None:
    engine = make_engine(
        LM,
        page_size=page_size,
        cache=cache,
        disable_radix_cache=disabled,
        max_running_requests=max_running,
    )
    prompts = _prompts(page_size)
    sp = SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True, n=3)
    before = engine.metrics()
    out = _run(engine, prompts, sp)
    for r, p in zip(
        sorted({k[0] for k in out}, key=lambda r: int(r.split("-")[1])), prompts, strict=True
    ):
        want = reference_greedy(LM, p, 7)
        assert [out[(r, i)] for i in range(3)] == [want] * 3
    m = engine.metrics()
    if max_running == 2:  # only one row free for 3 choices: some forks fell back to the queue
        assert m.forked_choices_total < 2 * len(prompts)
    if max_running == 32 and disabled:
        # Nothing shared between requests: each prompt computed exactly once for its 3 choices.
        assert m.prefill_tokens_total - before.prefill_tokens_total == sum(map(len, prompts))
        assert m.forked_choices_total == 2 * len(prompts)


def test_prompt_computed_once_with_tail_page() -> None:
    engine = make_engine(LM, page_size=16)
    prompt = _prompts(5)[1]  # 30 tokens: one whole page and a partial tail page
    sp = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, n=5)
    _run(engine, [prompt], sp)
    m = engine.metrics()
    assert m.prefill_tokens_total == len(prompt) and m.forked_choices_total == 4
    assert m.prompt_tokens_total == len(prompt)  # usage counts the prompt once


def test_seeded_choices_reproduce_and_choice0_is_n1() -> None:
    prompt = _prompts(1)[0]
    sp = SamplingParams(max_tokens=8, temperature=1.0, seed=42, n=4, ignore_eos=True)
    a = _run(make_engine(LM, page_size=4), [prompt], sp)
    b = _run(make_engine(LM, page_size=4, disable_radix_cache=True), [prompt], sp)
    assert list(a.values()) == list(b.values())
    assert len({tuple(v) for v in a.values()}) > 1
    one = _run(make_engine(LM), [prompt], SamplingParams(max_tokens=8, temperature=1.0, seed=42))
    assert next(iter(one.values())) == a[("req-0", 0)]


@pytest.mark.parametrize("disabled", [False, True])
def test_abort_mid_flight_frees_everything(disabled: bool) -> None:
    engine = make_engine(LM, page_size=4, disable_radix_cache=disabled)
    sp = SamplingParams(max_tokens=50, temperature=1.0, n=4, ignore_eos=True)
    rid = engine.add_request(_prompts(2)[1], sp)
    for _ in range(5):
        engine.step()
        engine.check_memory()
    assert engine.abort(rid)
    deltas = engine.step()
    assert sorted(d.index for d in deltas if d.finish_reason == "abort") == [0, 1, 2, 3]
    assert [d.finished for d in deltas].count(True) == 1
    engine.check_memory()
    engine.flush_cache()
    assert engine.allocator.free_slots == engine.allocator.num_slots


def test_choices_under_memory_pressure_match_reference() -> None:
    # A pool so small that forked choices are retracted and readmitted (and forks may fall back).
    engine: Any = make_engine(LM, page_size=4, num_slots=96, chunked_prefill_size=16)
    engine.scheduler.decode_reserve_tokens = 4
    prompts = _prompts(3)[:2]
    sp = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, n=3)
    out = _run(engine, prompts, sp)
    assert engine.metrics().num_preemptions > 0
    for j, p in enumerate(prompts):
        want = reference_greedy(LM, p, 12)
        assert [out[(f"req-{j}", i)] for i in range(3)] == [want] * 3


@pytest.mark.parametrize("seed", range(10))
def test_random_workloads_with_choices(seed: int) -> None:
    """Random prompts sharing prefixes, n in 1..4, random page size / pool / chunking / rows /
    cache design: every choice equals the reference and the census holds after every step."""
    rng = random.Random(1000 + seed)
    root = [rng.randrange(38) for _ in range(rng.randrange(1, 30))]
    prompts = [
        root[: rng.randrange(len(root) + 1)]
        + [rng.randrange(38) for _ in range(rng.randrange(1, 20))]
        for _ in range(rng.randrange(2, 6))
    ]
    ns = [rng.randrange(1, 5) for _ in prompts]
    max_tokens = [rng.randrange(1, 9) for _ in prompts]
    page_size = rng.choice([1, 2, 4, 16])
    longest = max(len(p) + m for p, m in zip(prompts, max_tokens, strict=True))
    engine: Any = make_engine(
        LM,
        page_size=page_size,
        num_slots=-(-longest // page_size) * page_size + rng.randrange(0, 160),
        chunked_prefill_size=rng.choice([1, 7, 512]),
        cache=rng.choice(["radix", "blockhash"]),
        disable_radix_cache=rng.random() < 0.3,
        max_running_requests=rng.choice([1, 3, 16]),
    )
    engine.scheduler.decode_reserve_tokens = rng.choice([0, 4])
    rids = [
        engine.add_request(p, SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True, n=n))
        for p, m, n in zip(prompts, max_tokens, ns, strict=True)
    ]
    out: dict[tuple[str, int], list[int]] = {}
    for _ in range(10_000):
        if not engine.has_unfinished():
            break
        for d in engine.step():
            out.setdefault((d.request_id, d.index), []).extend(d.new_token_ids)
        engine.check_memory()
    for rid, p, m, n in zip(rids, prompts, max_tokens, ns, strict=True):
        want = reference_greedy(LM, p, m)
        assert [out[(rid, i)] for i in range(n)] == [want] * n
    engine.flush_cache()
    assert engine.allocator.free_slots == engine.allocator.num_slots

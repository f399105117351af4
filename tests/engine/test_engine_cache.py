"""Cache invisibility and KV correctness: outputs must not depend on the cache mode."""

from __future__ import annotations

import pytest
from engine_helpers import (
    CACHE_MODES,
    GREEDY,
    make_engine,
    reference_greedy,
    run_checked,
    shared_prefix_workload,
)
from engine_toy import ToyLM

from radixkv.engine.types import SamplingParams


@pytest.mark.parametrize("page_size", [1, 16])
def test_greedy_identical_across_cache_modes(page_size: int) -> None:
    prompts = shared_prefix_workload()
    lm = ToyLM()
    expected = [reference_greedy(lm, p, GREEDY.max_tokens) for p in prompts]
    for kind, disabled in CACHE_MODES:
        eng = make_engine(
            lm,
            cache=kind,
            disable_radix_cache=disabled,
            page_size=page_size,
            chunked_prefill_size=24,
        )
        outs = run_checked(eng, prompts, GREEDY)
        got = [o.output_token_ids for o in outs]
        assert got == expected, (kind, disabled, page_size)
        m = eng.metrics()
        if disabled:
            assert m.cached_prompt_tokens_total == 0 and m.cached_tokens_in_tree == 0
        else:
            assert m.cached_prompt_tokens_total > 0
        assert eng.flush_cache()
        eng.check_memory()
        assert eng.allocator.free_slots == eng.allocator.num_slots


def test_reference_is_sensitive_to_context() -> None:
    # The toy model must notice a changed early token, or the tests above prove little.
    lm = ToyLM()
    p = shared_prefix_workload()[1]
    q = [(p[0] + 1) % 38, *p[1:]]
    assert reference_greedy(lm, p, 8) != reference_greedy(lm, q, 8)


@pytest.mark.parametrize("page_size", [1, 16])
def test_second_request_of_shared_prefix_hits(page_size: int) -> None:
    prompts = shared_prefix_workload()
    eng = make_engine(page_size=page_size)
    first = eng.generate([prompts[0]], GREEDY)[0]
    second = eng.generate([prompts[1]], GREEDY)[0]
    assert first.cached_tokens == 0
    assert second.cached_tokens == 48 if page_size == 16 else second.cached_tokens == 50
    assert second.ttft_s is not None and second.prompt_tokens == len(prompts[1])
    dup = eng.generate([prompts[0]], GREEDY)[0]  # a full hit still recomputes the last token
    assert dup.output_token_ids == first.output_token_ids
    assert dup.cached_tokens == (len(prompts[0]) - 1) // page_size * page_size


def test_namespaces_do_not_share() -> None:
    from radixkv.engine.types import RequestOptions

    p = shared_prefix_workload()[0]
    eng = make_engine()
    eng.generate([p], GREEDY, options=RequestOptions(cache_salt="a"))
    other = eng.generate([p], GREEDY, options=RequestOptions(cache_salt="b"))[0]
    same = eng.generate([p], GREEDY, options=RequestOptions(cache_salt="a"))[0]
    assert other.cached_tokens == 0 and same.cached_tokens > 0


def test_arrival_mid_prefill_hits_finished_chunks() -> None:
    lm = ToyLM()
    long_prompt = shared_prefix_workload()[0] * 4  # 236 tokens, 4 chunks of 64
    eng = make_engine(lm, chunked_prefill_size=64)
    a = eng.add_request(long_prompt, GREEDY)
    eng.step()
    eng.step()  # two chunks (128 tokens) are now in the tree
    b = eng.add_request([*long_prompt[:150], 1, 2, 3], GREEDY)
    outs: dict[str, list[int]] = {a: [], b: []}
    cached = {}
    while eng.has_unfinished():
        for d in eng.step():
            outs[d.request_id] += d.new_token_ids
            cached[d.request_id] = d.cached_tokens
        eng.check_memory()
    assert cached[b] >= 128
    assert outs[b] == reference_greedy(lm, [*long_prompt[:150], 1, 2, 3], GREEDY.max_tokens)


@pytest.mark.parametrize("policy", ["lpm", "fcfs"])
def test_schedule_policies_same_outputs(policy: str) -> None:
    prompts = shared_prefix_workload(seed=3)
    lm = ToyLM()
    expected = [reference_greedy(lm, p, 6) for p in prompts]
    eng = make_engine(lm, schedule_policy=policy, max_running_requests=3)
    outs = run_checked(eng, prompts, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    assert [o.output_token_ids for o in outs] == expected


def test_simultaneous_arrivals_share_instead_of_recomputing() -> None:
    # Both arrive before any step: the second waits for the first's prefill (deferral) and then
    # hits the shared 96 tokens instead of computing them in the same batch.
    lm = ToyLM()
    shared = shared_prefix_workload()[0][:48] * 2
    a_prompt, b_prompt = [*shared, 1, 2], [*shared, 3, 4, 5]
    eng = make_engine(lm, chunked_prefill_size=512)
    outs = run_checked(eng, [a_prompt, b_prompt], GREEDY)
    assert eng.metrics().cached_prompt_tokens_total == 96
    assert outs[1].output_token_ids == reference_greedy(lm, b_prompt, GREEDY.max_tokens)

"""KV memory: the census holds after every step, everything returns on finish/abort/flush, and a
workload bigger than the pool completes (eviction + retraction) with unchanged outputs."""

from __future__ import annotations

import pytest
from engine_helpers import CACHE_MODES, make_engine, reference_greedy, run_checked
from engine_helpers import shared_prefix_workload as workload
from engine_toy import ToyLM

from radixkv.engine.types import SamplingParams

LONG = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("kind,disabled", CACHE_MODES)
@pytest.mark.parametrize("page_size", [1, 16])
def test_workload_bigger_than_pool_completes_identically(
    kind: str, disabled: bool, page_size: int
) -> None:
    lm = ToyLM()
    prompts = workload(seed=1)
    expected = [reference_greedy(lm, p, LONG.max_tokens) for p in prompts]
    # 10 requests of up to ~100 tokens each (prompt + output) in a 160-slot pool.
    eng = make_engine(
        lm,
        num_slots=160,
        page_size=page_size,
        cache=kind,
        disable_radix_cache=disabled,
        chunked_prefill_size=32,
    )
    eng.scheduler.decode_reserve_tokens = 0  # admit greedily so decodes must retract
    outs = run_checked(eng, prompts, LONG)
    assert [o.output_token_ids for o in outs] == expected
    assert eng.metrics().num_preemptions > 0
    eng.flush_cache()
    eng.check_memory()
    assert eng.allocator.free_slots == eng.allocator.num_slots


@pytest.mark.parametrize("page_size", [1, 16])
def test_eviction_makes_room_without_retraction(page_size: int) -> None:
    lm = ToyLM()
    prompts = workload(seed=2)
    eng = make_engine(lm, num_slots=128, page_size=page_size, max_running_requests=1)
    outs = run_checked(eng, prompts, LONG)
    assert [o.output_token_ids for o in outs] == [
        reference_greedy(lm, p, LONG.max_tokens) for p in prompts
    ]
    assert eng.metrics().num_preemptions == 0
    assert eng.cache is not None and eng.cache.stats().evicted_tokens > 0


@pytest.mark.parametrize("page_size", [1, 16])
def test_abort_mid_generation_frees_everything(page_size: int) -> None:
    eng = make_engine(page_size=page_size, cache="radix", chunked_prefill_size=16)
    prompts = workload()
    ids = [eng.add_request(p, LONG) for p in prompts[:4]]
    for _ in range(6):
        eng.step()
        eng.check_memory()
    assert eng.abort(ids[0]) and eng.abort(ids[3])
    assert not eng.abort(ids[0])  # already gone
    eng.check_memory()
    finals = {d.request_id: d for d in eng.step() if d.finished}
    assert finals[ids[0]].finish_reason == "abort" and finals[ids[3]].finish_reason == "abort"
    for rid in ids[1:3]:
        eng.abort(rid)
    while eng.has_unfinished():
        eng.step()
    eng.check_memory()
    assert eng.metrics().running_requests == 0
    assert eng.flush_cache()
    assert eng.allocator.free_slots == eng.allocator.num_slots
    assert eng.cache is not None and eng.cache.total_size == 0


def test_abort_waiting_request_and_flush_while_running() -> None:
    eng = make_engine(max_running_requests=1)
    p = workload()
    a = eng.add_request(p[0], LONG)
    b = eng.add_request(p[1], LONG)
    out = [t for d in eng.step() if d.request_id == a for t in d.new_token_ids]
    assert eng.metrics().waiting_requests == 1
    assert eng.abort(b)
    eng.flush_cache()  # a still holds its lock: only unlocked prefixes go
    eng.check_memory()
    while eng.has_unfinished():
        out += [t for d in eng.step() if d.request_id == a for t in d.new_token_ids]
        eng.check_memory()
    assert len(out) == LONG.max_tokens


def test_census_detects_a_leak() -> None:
    eng = make_engine()
    eng.generate([workload()[0]], LONG)
    pages = eng.allocator.alloc_pages(1)  # slots that no owner accounts for
    assert pages is not None
    with pytest.raises(RuntimeError, match="census"):
        eng.check_memory()

"""Randomised workloads × configurations: outputs equal the reference decoder's and the KV census
holds after every step, whatever the page size, pool size, chunking, policy or cache design."""

from __future__ import annotations

import random

import pytest
from engine_helpers import make_engine, reference_greedy, run_checked
from engine_toy import ToyLM

from radixkv.engine.types import SamplingParams

_LM = ToyLM()
_REF: dict[tuple[tuple[int, ...], int], list[int]] = {}


def _ref(prompt: list[int], n: int) -> list[int]:
    key = (tuple(prompt), n)
    if key not in _REF:
        _REF[key] = reference_greedy(_LM, prompt, n)
    return _REF[key]


def _random_workload(rng: random.Random) -> list[list[int]]:
    roots = [[rng.randrange(38) for _ in range(rng.randrange(1, 40))] for _ in range(3)]
    prompts: list[list[int]] = []
    for _ in range(rng.randrange(4, 12)):
        base = rng.choice(roots + prompts) if prompts else rng.choice(roots)
        cut = rng.randrange(0, len(base) + 1)
        prompts.append(base[:cut] + [rng.randrange(38) for _ in range(rng.randrange(1, 25))])
    return prompts


@pytest.mark.parametrize("seed", range(12))
def test_random_workloads_and_configs(seed: int) -> None:
    rng = random.Random(seed)
    prompts = _random_workload(rng)
    max_tokens = [rng.randrange(1, 12) for _ in prompts]
    page_size = rng.choice([1, 2, 4, 16])
    longest = max(len(p) + m for p, m in zip(prompts, max_tokens, strict=True))
    need = -(-longest // page_size) * page_size
    cache = rng.choice(["radix", "blockhash"])
    # The block-hash peer orders eviction by LRU only.
    policies = ["lru", "lfu", "fifo", "mru", "priority"] if cache == "radix" else ["lru"]
    eng = make_engine(
        _LM,
        page_size=page_size,
        num_slots=need + rng.randrange(0, 200),
        chunked_prefill_size=rng.choice([1, 7, 32, 512]),
        schedule_policy=rng.choice(["lpm", "fcfs"]),
        cache=cache,
        disable_radix_cache=rng.random() < 0.2,
        eviction_policy=rng.choice(policies),
        max_running_requests=rng.choice([1, 3, 16]),
    )
    eng.scheduler.decode_reserve_tokens = rng.choice([0, 4, 32])
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in max_tokens]
    outs = run_checked(eng, prompts, params)
    for p, m, o in zip(prompts, max_tokens, outs, strict=True):
        assert o.output_token_ids == _ref(p, m)
    eng.flush_cache()
    eng.check_memory()
    assert eng.allocator.free_slots == eng.allocator.num_slots

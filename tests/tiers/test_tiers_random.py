"""Randomised workloads × tier configurations (page size, device and host pool sizes, chunking,
write and prefetch policies, eviction policy, with and without file storage, restarts): outputs
equal the reference decoder's, and the device and host censuses hold after every step."""

from __future__ import annotations

import random
from pathlib import Path

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


def _workload(rng: random.Random) -> list[list[int]]:
    roots = [[rng.randrange(38) for _ in range(rng.randrange(8, 60))] for _ in range(3)]
    prompts: list[list[int]] = []
    for _ in range(rng.randrange(4, 10)):
        base = rng.choice(roots + prompts) if prompts else rng.choice(roots)
        cut = rng.randrange(len(base) // 2, len(base) + 1)
        prompts.append(base[:cut] + [rng.randrange(38) for _ in range(rng.randrange(1, 20))])
    return prompts


@pytest.mark.parametrize("seed", range(8))
def test_random_workloads_through_the_tiers(seed: int, tmp_path: Path) -> None:
    rng = random.Random(1000 + seed)
    prompts = _workload(rng)
    max_tokens = [rng.randrange(1, 8) for _ in prompts]
    page_size = rng.choice([1, 2, 4, 16])
    longest = max(len(p) + m for p, m in zip(prompts, max_tokens, strict=True))
    need = -(-longest // page_size) * page_size
    cfg = {
        "page_size": page_size,
        "num_slots": need + rng.randrange(0, 100),
        "chunked_prefill_size": rng.choice([7, 32, 512]),
        "eviction_policy": rng.choice(["lru", "lfu", "fifo", "priority"]),
        "max_running_requests": rng.choice([1, 3, 16]),
        "enable_hierarchical_cache": rng.random() < 0.8,
        "hicache_size": rng.choice([None, 0.005, 0.05]),
        "hicache_write_policy": rng.choice(
            ["write_through", "write_through_selective", "write_back"]
        ),
    }
    if rng.random() < 0.6 or not cfg["enable_hierarchical_cache"]:
        cfg["hicache_storage_backend"] = "file"
        cfg["hicache_storage_url"] = str(tmp_path / "l3")
        cfg["hicache_storage_prefetch_policy"] = rng.choice(
            ["cost_aware", "best_effort", "wait_complete", "timeout"]
        )
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in max_tokens]
    for _ in range(2):  # the second engine is a restart on the same storage
        eng = make_engine(_LM, **cfg)
        for _ in range(2):
            order = list(range(len(prompts)))
            rng.shuffle(order)
            outs = run_checked(eng, [prompts[i] for i in order], [params[i] for i in order])
            for i, o in zip(order, outs, strict=True):
                assert o.output_token_ids == _ref(prompts[i], max_tokens[i]), (seed, cfg, i)
        eng.close()

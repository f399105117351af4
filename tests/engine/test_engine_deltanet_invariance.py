"""One answer per question through the engine for the gated DeltaNet families (Qwen3.5,
Qwen3-Next): a request's tokens AND log-probabilities are the same bits alone on a cold engine
with one prefill chunk, in random batch mixes under several prefill chunk sizes and page sizes,
and again when its prefix is a cache hit (a recurrent-state checkpoint resumed), in bfloat16 and
float32, greedy and seeded sampling. Chunk sizes and the checkpoint interval are not multiples of
each other, so prompts are cut (and resumed) at many different token boundaries.

The models are the seeded tiny checkpoints of tests/conftest.py, over the real layers and C++
kernels (the DeltaNet's: `kernels/deltanet.cpp`)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_helpers import Answer, answer_params, drive_answers

from radixkv.engine.engine import Engine

pytestmark = pytest.mark.slow


def _prompts(seed: int) -> list[list[int]]:
    """Shared system prompts, branches, a duplicate and a prefix of another prompt."""
    rng = random.Random(seed)

    def rand(n: int) -> list[int]:
        return [rng.randrange(3, 40000) for _ in range(n)]

    system = rand(75)
    ps = [system + rand(rng.randrange(1, 40)) for _ in range(3)]
    ps += [system[:50] + rand(21), rand(12), rand(1)]
    ps += [list(ps[1]), ps[0][:61]]
    return ps


def _drive(
    eng: Engine,
    prompts: list[list[int]],
    sampled: bool,
    order: list[int],
    rng: random.Random | None = None,
) -> dict[int, Answer]:
    return drive_answers(eng, prompts, lambda i: answer_params(i, sampled, 5), order, rng)


def _engine(lm: Any, **kw: Any) -> Engine:
    args: dict[str, Any] = {
        "device": "cpu",
        "dtype": "bfloat16" if lm.dtype == torch.bfloat16 else "float32",
        "num_slots": 2048,
        "chunked_prefill_size": 2048,
        "state_checkpoint_interval": 24,
    }
    return Engine(lm, **(args | kw))


@pytest.fixture(
    scope="module",
    params=[("qwen3_5", torch.bfloat16), ("qwen3_5", torch.float32), ("qwen3_next", torch.float32)],
    ids=["qwen3_5-bf16", "qwen3_5-f32", "qwen3_next-f32"],
)
def lm(request: pytest.FixtureRequest, tiny_model_dir: Callable[..., Path]) -> Any:
    from radixkv.model import load_model
    from radixkv.model.kernels import deltanet

    if deltanet() is None:
        pytest.skip("the DeltaNet kernel is not built on this machine")
    arch, dtype = request.param
    return load_model(str(tiny_model_dir(arch)), "cpu", dtype)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_answers_do_not_depend_on_batch_chunks_or_cache(lm: Any, sampled: bool) -> None:
    prompts = _prompts(1)
    alone: dict[int, Answer] = {}
    for i in range(len(prompts)):
        alone |= _drive(_engine(lm, disable_radix_cache=True), prompts, sampled, [i])
    rng = random.Random(7)
    for trial, (chunk, page) in enumerate([(7, 1), (16, 16), (37, 1)]):
        order = list(range(len(prompts)))
        rng.shuffle(order)
        eng = _engine(lm, chunked_prefill_size=chunk, page_size=page)
        got = _drive(eng, prompts, sampled, order, rng)  # random batch mixes, cold then warm
        assert got == alone, (trial, chunk, page)
        again = _drive(eng, prompts, sampled, order[::-1])  # resumed from checkpoints
        assert again == alone, (trial, "warm")
        assert eng.metrics().cached_prompt_tokens_total > 0

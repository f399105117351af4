"""One answer per question through the engine: a request's tokens AND log-probabilities are the
same bits alone on a cold engine, in any batch mix, under any prefill chunk size and page size,
after a cached prefix or a full hit, restored from the host tier, as a choice of an n > 1 request,
and eager or compiled; in bfloat16 and float32, greedy and seeded sampling.

The model is a tiny random Llama checkpoint run by the real layers and C++ kernels (head_dim 16,
so every kernel serves it). Log-probabilities are compared exactly (they are the request's logits
after a log-softmax), so any change of a logit bit in the sampled token's row shows."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_helpers import Answer, answer_params, drive_answers

from radixkv.engine.engine import Engine
from radixkv.engine.types import SamplingParams

pytestmark = pytest.mark.slow


def _prompts(seed: int) -> list[list[int]]:
    """Shared system prompts, branches, an exact duplicate and a prefix of another prompt."""
    rng = random.Random(seed)

    def rand(n: int) -> list[int]:
        return [rng.randrange(3, 40000) for _ in range(n)]

    system, other = rand(70), rand(33)
    branch = system + rand(19)
    ps = [system + rand(rng.randrange(1, 40)) for _ in range(4)]
    ps += [branch + rand(5), branch + rand(30), other + rand(9), rand(12), rand(1)]
    ps += [list(ps[1]), ps[5][:40]]
    return ps


def _drive(
    eng: Engine,
    prompts: list[list[int]],
    sampled: bool,
    order: list[int],
    rng: random.Random | None = None,
) -> dict[int, Answer]:
    return drive_answers(eng, prompts, lambda i: answer_params(i, sampled, 7), order, rng)


def _engine(lm: Any, **kw: Any) -> Engine:
    dtype = "bfloat16" if lm.dtype == torch.bfloat16 else "float32"
    args: dict[str, Any] = {
        "device": "cpu",
        "dtype": dtype,
        "num_slots": 4096,
        "chunked_prefill_size": 2048,
    }
    args.update(kw)
    return Engine(lm, **args)


@pytest.fixture(scope="module", params=[torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def lm(request: pytest.FixtureRequest, tiny_model_dir: Callable[..., Path]) -> Any:
    from radixkv.model import load_model

    return load_model(str(tiny_model_dir("llama")), "cpu", request.param)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_answers_do_not_depend_on_batch_chunks_or_cache(lm: Any, sampled: bool) -> None:
    prompts = _prompts(1)
    # The reference: each prompt alone, cache off, one prefill chunk.
    alone = {}
    for i in range(len(prompts)):
        alone |= _drive(_engine(lm, disable_radix_cache=True), prompts, sampled, [i])
    rng = random.Random(7)
    for trial, (chunk, page) in enumerate([(7, 1), (16, 16), (64, 1), (2048, 16)]):
        order = list(range(len(prompts)))
        rng.shuffle(order)
        eng = _engine(lm, chunked_prefill_size=chunk, page_size=page)
        got = _drive(eng, prompts, sampled, order, rng)  # random batch mixes, cold then warm
        assert got == alone, (trial, chunk, page)
        again = _drive(eng, prompts, sampled, order[::-1])  # everything cached: hits, full hits
        assert again == alone, (trial, "warm")
        assert eng.metrics().cached_prompt_tokens_total > 0


def test_answers_survive_the_host_tier_and_forks(lm: Any) -> None:
    """A small device pool pushes prefixes to the host tier and back; n = 3 choices fork one
    prefill; all equal the lone cold answers."""
    prompts = _prompts(2)
    alone = {}
    for i in range(len(prompts)):
        alone |= _drive(_engine(lm, disable_radix_cache=True), prompts, True, [i])
    eng = _engine(
        lm, num_slots=256, page_size=4, enable_hierarchical_cache=True, chunked_prefill_size=32
    )
    for _ in range(2):
        for i in range(len(prompts)):  # one by one: each finds the others' pages in the tiers
            assert _drive(eng, prompts, True, [i]) == {i: alone[i]}, i
    assert eng.metrics().cached_prompt_tokens_total > 0
    fork = _engine(lm)
    rid = fork.add_request(
        prompts[3], SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True, logprobs=3, n=3)
    )
    outs: dict[int, list[int]] = {0: [], 1: [], 2: []}
    while fork.has_unfinished():
        for d in fork.step():
            assert d.request_id == rid
            outs[d.index].extend(d.new_token_ids)
        fork.check_memory()
    greedy = _drive(_engine(lm, disable_radix_cache=True), prompts, False, [3])[3][0]
    assert all(tuple(o) == greedy for o in outs.values())


def test_compiled_and_eager_engines_agree(tiny_model_dir: Callable[..., Path]) -> None:
    from radixkv.model import load_model

    prompts = _prompts(3)
    eager = load_model(str(tiny_model_dir("llama")), "cpu", torch.bfloat16)
    compiled = load_model(str(tiny_model_dir("llama")), "cpu", torch.bfloat16)
    order = list(range(len(prompts)))
    a = _drive(_engine(eager, compile=False), prompts, False, order)
    b = _drive(_engine(compiled, compile=True), prompts, False, order, random.Random(1))
    assert a == b

"""Logits processors and logprobs against naive per-token references: presence / frequency
(OpenAI), repetition (HF), logit_bias, and logprobs taken from the raw logits."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from radixkv.engine.sampling.logits import apply_processors, next_tokens
from radixkv.engine.sampling.sampler import make_generator
from radixkv.engine.types import SamplingParams

V = 50


def _naive(row: list[float], p: SamplingParams, tokens: list[int], num_prompt: int) -> list[float]:
    out = list(row)
    if p.repetition_penalty != 1.0:
        for t in set(tokens):
            out[t] = out[t] / p.repetition_penalty if out[t] > 0 else out[t] * p.repetition_penalty
    gen = tokens[num_prompt:]
    for t in set(gen):
        out[t] -= p.presence_penalty + p.frequency_penalty * gen.count(t)
    for t, b in p.logit_bias:
        out[t] += b
    return out


@pytest.mark.parametrize("seed", range(20))
def test_processors_match_naive(seed: int) -> None:
    rng = random.Random(seed)
    row = [rng.uniform(-5, 5) for _ in range(V)]
    tokens = [rng.randrange(V) for _ in range(rng.randrange(1, 30))]
    num_prompt = rng.randrange(len(tokens) + 1)
    p = SamplingParams(
        presence_penalty=rng.choice([0.0, 0.5, -1.5]),
        frequency_penalty=rng.choice([0.0, 0.3, 2.0]),
        repetition_penalty=rng.choice([1.0, 1.3, 0.8]),
        logit_bias=tuple(
            (rng.randrange(V), rng.uniform(-100, 100)) for _ in range(rng.randrange(3))
        ),
    )
    got = apply_processors(torch.tensor(row), p, tokens, num_prompt, None).tolist()
    want = _naive(row, p, tokens, num_prompt)
    assert all(
        math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-4) for a, b in zip(got, want, strict=True)
    )


@dataclass
class _Req:
    sampling: SamplingParams
    tokens: list[int] = field(default_factory=lambda: [1, 2, 3])
    num_prompt: int = 3
    generator: Any = None
    matcher: Any = None


def test_logprobs_are_of_the_raw_logits_and_bias_steers_sampling() -> None:
    logits = torch.randn(2, V, generator=make_generator(0))
    biased = SamplingParams(temperature=0.0, logprobs=3, logit_bias=((7, 100.0),))
    plain = SamplingParams(temperature=0.0, logprobs=0)
    toks, lps = next_tokens(logits, [_Req(biased), _Req(plain)])
    assert toks[0] == 7 and toks[1] == int(logits[1].argmax())
    raw = torch.log_softmax(logits, dim=-1)
    lp0, top0 = lps[0]  # type: ignore[misc]
    assert math.isclose(lp0, float(raw[0, 7]), abs_tol=1e-6)  # the bias is not in the logprob
    assert [t for t, _ in top0] == torch.topk(raw[0], 3).indices.tolist()
    lp1, top1 = lps[1]  # type: ignore[misc]
    assert top1 == [] and math.isclose(lp1, float(raw[1].max()), abs_tol=1e-6)


def test_processed_rows_sample_from_their_own_generator() -> None:
    logits = torch.randn(1, V, generator=make_generator(1)).repeat(3, 1)
    sp = SamplingParams(temperature=1.0, presence_penalty=0.1)
    runs = []
    for _ in range(2):
        reqs = [_Req(sp, generator=make_generator(s)) for s in (5, 6, 5)]
        seq = [next_tokens(logits, reqs)[0] for _ in range(8)]
        runs.append(seq)
    assert runs[0] == runs[1]
    assert [s[0] for s in runs[0]] == [s[2] for s in runs[0]]  # same seed, same draws

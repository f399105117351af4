"""Shared helpers for engine tests: build engines over the toy model, drive them step by step with
the memory census checked after every step, and an independent no-cache reference decoder."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch
from engine_toy import ToyLM

from radixkv.engine.batch import ForwardBatch
from radixkv.engine.engine import Engine
from radixkv.engine.types import RequestOutput, SamplingParams
from radixkv.memory.pool import KVPool

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)

# (cache kind, disable_radix_cache) triples exercised by the invisibility tests.
CACHE_MODES = [("radix", False), ("radix", True), ("blockhash", False)]


def make_engine(lm: Any | None = None, **overrides: Any) -> Engine:
    kw: dict[str, Any] = {"device": "cpu", "num_slots": 4096, "chunked_prefill_size": 64}
    kw.update(overrides)
    return Engine(lm if lm is not None else ToyLM(), **kw)


def run_checked(
    engine: Engine, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
) -> list[RequestOutput]:
    """Add all prompts, step to completion, check the KV census after every step."""
    plist = params if isinstance(params, list) else [params] * len(prompts)
    reqs = [engine.add_request(p, sp) for p, sp in zip(prompts, plist, strict=True)]
    outs: dict[str, list[int]] = {r: [] for r in reqs}
    steps = 0
    while engine.has_unfinished():
        for d in engine.step():
            outs[d.request_id].extend(d.new_token_ids)
        engine.check_memory()
        steps += 1
        assert steps < 10_000, "engine made no progress"
    return [RequestOutput(r, [], outs[r], "", None, 0, 0) for r in reqs]


def shared_prefix_workload(seed: int = 0, vocab: int = 38) -> list[list[int]]:
    """Prompts with shared system prefixes, branches of branches, and exact duplicates."""
    rng = random.Random(seed)

    def rand(n: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(n)]

    sys_a, sys_b = rand(50), rand(23)
    branch = sys_a + rand(17)
    prompts = [
        sys_a + rand(9),
        sys_a + rand(30),
        branch + rand(5),
        branch + rand(21),
        sys_b + rand(3),
        sys_b + rand(40),
        sys_a + rand(2),
        rand(12),
    ]
    prompts.append(list(prompts[2]))  # exact duplicate: a full hit still computes the last token
    prompts.append(prompts[1][:20])  # a prefix of another prompt
    return prompts


def reference_greedy(lm: Any, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy decoding by full recomputation on a fresh pool each token (no cache, no reuse)."""
    tokens = list(prompt)
    out: list[int] = []
    for _ in range(max_tokens):
        n = len(tokens)
        pool = KVPool(lm.config.pool_config(n, torch.float32, "cpu"))
        slots = torch.arange(n, dtype=torch.int64)
        batch = ForwardBatch.from_contexts(torch.tensor(tokens), [slots], [n])
        with torch.inference_mode():
            tok = int(lm.model(batch, pool)[0].argmax())
        out.append(tok)
        tokens.append(tok)
    return out


Answer = tuple[tuple[int, ...], tuple[str, ...]]  # a request's tokens and logprobs (repr)


def answer_params(i: int, sampled: bool, max_tokens: int) -> SamplingParams:
    """Request i's sampling in the invariance suites: greedy, or seeded per request; logprobs."""
    if sampled:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=0.9,
            top_p=0.95,
            seed=100 + i,
            ignore_eos=True,
            logprobs=3,
        )
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=3)


def drive_answers(
    eng: Engine,
    prompts: list[list[int]],
    params: Callable[[int], SamplingParams],
    order: list[int],
    rng: random.Random | None = None,
) -> dict[int, Answer]:
    """Add prompts[i] with params(i) for i in `order` (with `rng`, a random number of engine
    steps between arrivals, so they join running batches at random points), run them to the
    end with the memory census checked after every step; each one's answer by index."""
    ids: dict[str, int] = {}
    toks: dict[int, list[int]] = {i: [] for i in order}
    lps: dict[int, list[Any]] = {i: [] for i in order}

    def step() -> None:
        for d in eng.step():
            i = ids[d.request_id]
            toks[i].extend(d.new_token_ids)
            lps[i].extend(d.logprobs or [])
        eng.check_memory()

    for i in order:
        ids[eng.add_request(prompts[i], params(i))] = i
        for _ in range(rng.randrange(0, 4) if rng else 0):
            step()
    while eng.has_unfinished():
        step()
    return {i: (tuple(toks[i]), tuple(repr(x) for x in lps[i])) for i in order}

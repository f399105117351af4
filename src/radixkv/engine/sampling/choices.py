"""Parallel sampling (n > 1): per-choice seed streams and the fork of choices from one prefill.

A request with n choices enters the scheduler as choice 0 only; choices 1..n-1 wait on it. In the
step where choice 0's prompt is fully computed, each waiting choice forks from it
(`KVManager.fork`): it shares the cache-owned whole pages through the tree lock, gets its own
copy of the parent's remaining computed K/V (the partial tail page; the whole prompt when the
prefix cache is off), and samples its first token from the parent's last logits row. A hybrid
model's choice also reads the parent's SWA window through the tree, gets copies of the parent's
own SWA K/V, and a copy of its working recurrent state (copy-on-write: the parent's slots are
never written by the child). So the
prompt is computed once and no choice recomputes a single prompt position. A choice that cannot
fork (no free row or pages) falls back to the waiting queue, where it is admitted like any
request (reusing the cached prefix, or recomputing it when the cache is off).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from radixkv.engine.request import Request
from radixkv.engine.sampling.sampler import make_generator
from radixkv.engine.sampling.stop import TextStream
from radixkv.engine.types import RequestError, RequestOptions, SamplingParams

if TYPE_CHECKING:
    from radixkv.engine.engine import Engine

_GOLDEN = 0x9E37_79B9_7F4A_7C15


def choice_seed(seed: int, index: int) -> int:
    """Choice 0 uses `seed` itself (so n=1 and choice 0 of n agree); others a mixed stream."""
    return seed if index == 0 else (seed ^ (index * _GOLDEN)) & 0xFFFF_FFFF_FFFF_FFFF


def generator(params: SamplingParams, seed: int, index: int) -> torch.Generator | None:
    return None if params.greedy else make_generator(choice_seed(seed, index))


def validate(sampling: SamplingParams, max_n: int, vocab_size: int) -> None:
    """Engine-side limits of a request's n and logit_bias (RequestError → 400)."""
    if sampling.n > max_n:
        raise RequestError(
            f"n={sampling.n} is above this server's limit of {max_n} (--max-n)", param="n"
        )
    for tid, _ in sampling.logit_bias:
        if not 0 <= tid < vocab_size:
            raise RequestError(
                f"logit_bias: token id {tid} is outside the vocabulary [0, {vocab_size})",
                param="logit_bias",
            )


def make_grammar(engine: Engine) -> Any:
    from radixkv.engine.sampling.grammar import GrammarCompiler

    return GrammarCompiler(
        engine.tokenizer.backend.to_str(), engine.vocab_size, sorted(engine.eos_token_ids)
    )


def make_group(
    engine: Engine,
    rid: str,
    ids: list[int],
    sampling: SamplingParams,
    options: RequestOptions,
    seed: int,
) -> list[Request]:
    """The n choices of one request; choice 0 is scheduled, the others wait in its `forks`.
    Compiles the grammar first, so an unsupported schema is a RequestError before anything."""
    lark = sampling.json_schema is None and sampling.grammar is not None
    spec = sampling.grammar if lark else sampling.json_schema
    matchers = [engine.grammar.matcher(spec, lark) for _ in range(sampling.n)] if spec else None
    group = [
        Request(
            request_id=rid,
            prompt_ids=ids,
            sampling=sampling,
            options=options,
            stream=TextStream(engine.tokenizer.make_decoder(), sampling.stop),
            generator=generator(sampling, seed, i),
            index=i,
            matcher=matchers[i] if matchers else None,
            logprobs=[] if sampling.logprobs is not None else None,
        )
        for i in range(sampling.n)
    ]
    group[0].forks = group[1:]
    return group


def copy_kv(engine: Engine, src: object, dst: object) -> None:
    """Copy K/V of slots `src` into slots `dst` in every layer (the fork's own pages)."""
    engine.pool.copy_slots(src, dst)


def fork_all(engine: Engine, parent: Request) -> list[Request]:
    """Fork the choices waiting on `parent` (whose prompt is computed); the running ones."""
    waiting, parent.forks = parent.forks, []
    forked: list[Request] = []
    sched = engine.scheduler
    for child in waiting:
        got = engine.kv.fork(parent, child) if sched.has_free_row else None
        if got is None:
            sched.add(child)  # admitted later like any request
            continue
        copy_kv(engine, *got)
        child.cached_tokens = parent.cached_tokens
        sched.adopt(child)
        forked.append(child)
    return forked


def fork_ready(engine: Engine, rows: list[int], reqs: list[Request]) -> int:
    """For each request of this step's sampling rows (`rows[i]` is `reqs[i]`'s logits row)
    whose prompt is now computed and that has choices waiting, fork them; the forked ones are
    appended to `rows` / `reqs` with their parent's row (they sample from its last logits).
    Returns how many forked."""
    count = 0
    for i, parent in zip(list(rows), list(reqs), strict=True):
        if parent.forks:
            forked = fork_all(engine, parent)
            count += len(forked)
            rows += [i] * len(forked)
            reqs += forked
    return count

"""One step's next tokens for the ready rows: logprobs of the raw logits, logits processors
(penalties, logit_bias, grammar mask), then sampling.

Order per row, as vLLM does by default: logprobs are the f32 log-softmax of the model's *raw*
logits (before temperature, penalties, bias and grammar); then repetition / presence / frequency
penalties, logit_bias, the grammar mask; then temperature / top-k / top-p sampling (sampler.py).
Rows that need none of this take the batched fast path of `sampler.sample`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from radixkv.engine.sampling.sampler import rows_of, sample, sample_one
from radixkv.engine.types import SamplingParams, TokenLogprobs


def apply_processors(
    row: torch.Tensor, params: SamplingParams, tokens: Sequence[int], num_prompt: int, matcher: Any
) -> torch.Tensor:
    """Penalties, bias and grammar applied to one 1-D f32 CPU row (a processed copy)."""
    row = row.clone()
    # `tokens` may be a TokenBuffer whose slices are numpy views: test lengths, not truthiness.
    if params.repetition_penalty != 1.0 and len(tokens):
        ids = torch.unique(torch.tensor(list(tokens), dtype=torch.long))
        vals = row[ids]
        p = params.repetition_penalty
        row[ids] = torch.where(vals > 0, vals / p, vals * p)
    output = tokens[num_prompt:]
    if (params.presence_penalty or params.frequency_penalty) and len(output):
        ids, counts = torch.unique(torch.tensor(list(output), dtype=torch.long), return_counts=True)
        row[ids] -= params.presence_penalty + params.frequency_penalty * counts.to(row.dtype)
    if params.logit_bias:
        ids = torch.tensor([t for t, _ in params.logit_bias], dtype=torch.long)
        row[ids] += torch.tensor([b for _, b in params.logit_bias], dtype=row.dtype)
    if matcher is not None and not matcher.done:
        matcher.apply(row)
    return row


def token_logprobs(lp: torch.Tensor, token: int, k: int) -> TokenLogprobs:
    """(logprob of `token`, top-k (id, logprob) best first) from one log-softmax row."""
    top: list[tuple[int, float]] = []
    if k > 0:
        values, ids = torch.topk(lp, k)
        top = [(int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    return float(lp[token]), top


def next_tokens(
    logits: torch.Tensor, reqs: Sequence[Any]
) -> tuple[list[int], list[TokenLogprobs | None]]:
    """Next token (and, when asked, its logprobs) for each row of `logits` ([R, vocab]).

    `reqs[i]` is the request (choice) of row i: it provides .sampling, .generator, .tokens,
    .num_prompt and .matcher (None without a grammar). Each choice draws from its own generator.
    """
    n = len(reqs)
    tokens = [0] * n
    plain = [i for i, r in enumerate(reqs) if not r.sampling.processed]
    special = [i for i, r in enumerate(reqs) if r.sampling.processed]
    if plain:
        got = sample(
            rows_of(logits, plain),
            [reqs[i].sampling for i in plain],
            [reqs[i].generator for i in plain],
        )
        for i, t in zip(plain, got, strict=True):
            tokens[i] = t
    if special:
        rows = logits[special].float().cpu()
        for j, i in enumerate(special):
            r = reqs[i]
            row = apply_processors(rows[j], r.sampling, r.tokens, r.num_prompt, r.matcher)
            tokens[i] = sample_one(row, r.sampling, r.generator)
    out: list[TokenLogprobs | None] = [None] * n
    want = [i for i, r in enumerate(reqs) if r.sampling.logprobs is not None]
    if want:
        lps = torch.log_softmax(rows_of(logits, want).float(), dim=-1).cpu()
        for j, i in enumerate(want):
            out[i] = token_logprobs(lps[j], tokens[i], int(reqs[i].sampling.logprobs))
    for i, r in enumerate(reqs):
        if r.matcher is not None and not r.matcher.done:
            r.matcher.advance(tokens[i])
    return tokens, out

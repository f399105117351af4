"""A minimal single-request greedy generator over the KV pool (no engine, no cache).

For smoke tests, benchmarks of the model alone, and reference outputs; slots are simply the
positions 0..n-1 of a private pool.
"""

from __future__ import annotations

import torch

from radixkv.memory.pool import KVPool
from radixkv.model.batch import ForwardBatch
from radixkv.model.loader import LoadedModel


def single_batch(ids: list[int], start: int, slots: torch.Tensor) -> ForwardBatch:
    """One request extending a context of `start` tokens by `ids`; slot of position p = slots[p]."""
    return ForwardBatch.from_contexts(ids, [slots[: start + len(ids)]], [len(ids)])


def greedy_generate(
    lm: LoadedModel, prompt_ids: list[int], max_new_tokens: int, stop_at_eos: bool = True
) -> list[int]:
    """Greedy continuation of `prompt_ids` (prefill in one step, then one token per step)."""
    total = len(prompt_ids) + max_new_tokens
    pool = KVPool(lm.config.pool_config(total, dtype=lm.dtype, device=str(lm.device)))
    slots = torch.arange(total, dtype=torch.int64, device=lm.device)
    logits = lm.model(single_batch(prompt_ids, 0, slots), pool)
    out: list[int] = []
    pos = len(prompt_ids)
    for _ in range(max_new_tokens):
        tok = int(logits[-1].argmax())
        out.append(tok)
        if stop_at_eos and tok in lm.tokenizer.eos_token_ids:
            break
        if len(out) == max_new_tokens:
            break
        logits = lm.model(single_batch([tok], pos, slots), pool)
        pos += 1
    return out

"""A standalone driver for any loaded model over its component pools (no engine, no tree).

`Session` owns a `ModelPools` built from `config.pool_spec()` and hands out slots of each component
itself (in a seeded random order if asked, so a model can only be right if it really reads by
slot). It runs batched steps over sequences, frees each sequence's SWA slots as they leave the
window (their table entries become -1), takes STATE checkpoints, and forks new sequences from a
checkpoint (sharing the prefix's FULL/SWA slots, copying the state): the same moves the engine
makes, so the models' exactness can be tested before (and apart from) the engine integration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from radixkv.memory.hybrid import FULL, STATE, SWA, ModelPools, PoolSpec
from radixkv.model.batch import ForwardBatch
from radixkv.model.loader import LoadedModel


class FreeList:
    """Slots 0..n-1, handed out in order, or in a seeded random order."""

    def __init__(self, n: int, seed: int | None = None) -> None:
        order = list(range(n))
        if seed is not None:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
        self.free = order[::-1]  # pop() from the end = order[0] first
        self.size = n

    def take(self, n: int) -> list[int]:
        if n > len(self.free):
            raise MemoryError(f"pool of {self.size} slots exhausted")
        return [self.free.pop() for _ in range(n)]

    def give(self, slots: list[int]) -> None:
        self.free.extend(slots)


@dataclass
class Seq:
    """A sequence: its tokens, and per computed position its FULL and SWA slot (-1: freed)."""

    tokens: list[int]
    full: list[int] = field(default_factory=list)
    swa: list[int] = field(default_factory=list)
    state: int = -1  # working state slot (-1: the model has no state layers)
    owned_from: int = 0  # positions before this are shared (a fork's prefix): never freed here

    @property
    def computed(self) -> int:
        return max(len(self.full), len(self.swa))


@dataclass(frozen=True)
class Checkpoint:
    """A sequence's reusable prefix at `length`: slots of that prefix and a frozen state copy."""

    tokens: tuple[int, ...]
    full: tuple[int, ...]
    swa: tuple[int, ...]
    state: int


class Session:
    def __init__(
        self,
        lm: LoadedModel,
        num_slots: int = 256,
        num_states: int = 8,
        seed: int | None = None,
        free_swa: bool = True,
    ) -> None:
        self.lm = lm
        self.spec: PoolSpec = lm.config.pool_spec()
        self.pools: ModelPools = self.spec.make_pools(
            {FULL: num_slots, SWA: num_slots, STATE: num_states}, lm.dtype, str(lm.device)
        )
        self.full = FreeList(num_slots, seed)
        self.swa = FreeList(num_slots, None if seed is None else seed + 1)
        self.states = FreeList(num_states, None if seed is None else seed + 2)
        self.free_swa = free_swa

    def new(self, tokens: list[int]) -> Seq:
        seq = Seq(list(tokens))
        if STATE in self.spec:
            seq.state = self.states.take(1)[0]
        return seq

    def _contexts(self, seq: Seq, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        if FULL in self.spec:
            seq.full += self.full.take(n)
        if SWA in self.spec:
            seq.swa += self.swa.take(n)
        full = torch.tensor(seq.full, dtype=torch.int64) if FULL in self.spec else None
        swa = torch.tensor(seq.swa, dtype=torch.int64) if SWA in self.spec else None
        main = full if full is not None else swa
        assert main is not None
        return main, swa

    def _kind_slots(self, work: list[tuple[Seq, int]], swa_ctx: list[torch.Tensor]) -> dict:
        """The batch's slots of the kinds besides FULL (`ForwardBatch.kind_slots`)."""
        out: dict[str, Any] = {}
        if SWA in self.spec:
            out[SWA] = swa_ctx
        if STATE in self.spec:
            out[STATE] = [s.state for s, _ in work]
        return out

    def step(self, work: list[tuple[Seq, int]], all_logits: bool = True) -> list[torch.Tensor]:
        """Extend each sequence by its next n tokens in one forward; per-sequence logits."""
        ids: list[int] = []
        ctx, swa_ctx = [], []
        for seq, n in work:
            start = seq.computed
            if start + n > len(seq.tokens):
                raise ValueError("not enough tokens")
            ids += seq.tokens[start : start + n]
            main, swa = self._contexts(seq, n)
            ctx.append(main)
            if swa is not None:
                swa_ctx.append(swa)
        batch = ForwardBatch.from_contexts(
            ids,
            ctx,
            [n for _, n in work],
            device=self.lm.device,
            return_all_logits=all_logits,
            kind_slots=self._kind_slots(work, swa_ctx),
        )
        logits = self.lm.model(batch, self.pools)
        if self.free_swa:
            for seq, _ in work:
                self._drop_out_of_window(seq)
        return list(logits.split([n for _, n in work])) if all_logits else list(logits)

    def _drop_out_of_window(self, seq: Seq) -> None:
        """Free SWA slots no later step can read: positions < computed - W + 1."""
        window = self.spec.window(SWA)
        if window is None:
            return
        end = seq.computed - window + 1
        for p in range(max(0, end)):
            if seq.swa[p] >= 0:
                if p >= seq.owned_from:
                    self.swa.give([seq.swa[p]])
                seq.swa[p] = -1

    def checkpoint(self, seq: Seq) -> Checkpoint:
        """Freeze `seq`'s prefix as computed so far; the prefix's slots stop being `seq`'s."""
        state = -1
        if STATE in self.spec:
            state = self.states.take(1)[0]
            pool = self.pools.state()
            assert pool is not None
            pool.copy_state(seq.state, state)
        seq.owned_from = seq.computed
        n = seq.computed
        return Checkpoint(tuple(seq.tokens[:n]), tuple(seq.full), tuple(seq.swa), state)

    def fork(self, ckpt: Checkpoint, suffix: list[int]) -> Seq:
        """A new sequence continuing from the checkpoint (copy-on-write of the state)."""
        seq = Seq([*ckpt.tokens, *suffix], list(ckpt.full), list(ckpt.swa))
        seq.owned_from = len(ckpt.tokens)
        if STATE in self.spec:
            seq.state = self.states.take(1)[0]
            pool = self.pools.state()
            assert pool is not None
            pool.copy_state(ckpt.state, seq.state)
        return seq


def greedy_generate_hybrid(
    lm: LoadedModel,
    prompt_ids: list[int],
    max_new_tokens: int,
    chunk_size: int | None = None,
    stop_at_eos: bool = True,
) -> list[int]:
    """Greedy continuation of `prompt_ids` (prefill in chunks of `chunk_size`, then decode)."""
    total = len(prompt_ids) + max_new_tokens
    sess = Session(lm, num_slots=max(total, 1), num_states=1)
    seq = sess.new(prompt_ids)
    chunk = chunk_size or len(prompt_ids)
    logits = torch.empty(0)
    while seq.computed < len(prompt_ids):
        n = min(chunk, len(prompt_ids) - seq.computed)
        logits = sess.step([(seq, n)], all_logits=False)[0]
    out: list[int] = []
    for _ in range(max_new_tokens):
        tok = int(logits.argmax())
        out.append(tok)
        if (stop_at_eos and tok in lm.tokenizer.eos_token_ids) or len(out) == max_new_tokens:
            break
        seq.tokens.append(tok)
        logits = sess.step([(seq, 1)], all_logits=False)[0]
    return out

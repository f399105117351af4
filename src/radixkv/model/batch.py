"""The one dataclass that describes a forward step (the runner → model contract)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ForwardBatch:
    """One step over R requests, each extending its context by `extend_lens[r]` new tokens.

    New tokens of all requests are concatenated in request order (length T = sum(extend_lens)).
    Request r's context after this step has `seq_lens[r]` tokens; its first `prefix_lens[r]`
    (= seq_lens - extend_lens) are already in the KV pool (cache hit or earlier chunks/steps), and
    `context_slots[r]` ([seq_lens[r]] int64) says where every context token's K/V lives, the new
    tokens' slots included. The model writes the new tokens' K/V to `out_slots` before attending,
    then token i of request r attends to context positions <= its own position.

    The model never knows whether a slot came from a cache hit.

    Hybrid models (see radixkv.memory.hybrid) add two components; both fields are None otherwise:
    - SWA layers (window W) write new K/V at `swa_out_slots` and read `swa_context_slots[r]`
      ([seq_lens[r]] slots of the SWA pool). Positions p < prefix_lens[r] - W + 1 are never read
      and may hold -1 (freed: out of every window of this step).
    - STATE layers continue request r's state in StatePool slot `state_slots[r]`: it must hold the
      state after exactly prefix_lens[r] tokens (ignored, zeros used, when prefix_lens[r] == 0) and
      holds the state after seq_lens[r] tokens when the forward returns (updated in place).
    """

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, position of each new token within its request
    out_slots: torch.Tensor  # [T] int64, the pool slot each new token's K/V is written to
    extend_lens: tuple[int, ...]  # [R]
    seq_lens: tuple[int, ...]  # [R]
    context_slots: tuple[torch.Tensor, ...]  # R tensors of [seq_lens[r]] int64
    return_all_logits: bool = False  # tests: logits for every new token, not only the last
    swa_context_slots: tuple[torch.Tensor, ...] | None = None  # R tensors of [seq_lens[r]] int64
    swa_out_slots: torch.Tensor | None = None  # [T] int64, SWA-pool slot of each new token
    state_slots: tuple[int, ...] | None = None  # [R] working-state slot of each request

    @classmethod
    def from_contexts(
        cls,
        input_ids: Sequence[int] | torch.Tensor,
        context_slots: Sequence[torch.Tensor],
        extend_lens: Sequence[int],
        *,
        device: torch.device | str | None = None,
        return_all_logits: bool = False,
        swa_context_slots: Sequence[torch.Tensor] | None = None,
        state_slots: Sequence[int] | None = None,
    ) -> ForwardBatch:
        """The batch in which request r's new tokens are the last `extend_lens[r]` positions of
        its context `context_slots[r]`; positions, out_slots and seq_lens follow from that (and
        swa_out_slots from `swa_context_slots`, which must have the same lengths)."""
        seq_lens = tuple(int(c.shape[0]) for c in context_slots)
        positions = [
            torch.arange(s - e, s, dtype=torch.int64)
            for s, e in zip(seq_lens, extend_lens, strict=True)
        ]
        out_slots = [c[c.shape[0] - e :] for c, e in zip(context_slots, extend_lens, strict=True)]
        if device is None:
            device = context_slots[0].device if context_slots else "cpu"
        swa_ctx = None if swa_context_slots is None else tuple(swa_context_slots)
        swa_out = None
        if swa_ctx is not None:
            if tuple(int(c.shape[0]) for c in swa_ctx) != seq_lens:
                raise ValueError("swa_context_slots must cover the same positions as context_slots")
            swa_out = torch.cat(
                [c[c.shape[0] - e :] for c, e in zip(swa_ctx, extend_lens, strict=True)]
            ).to(device)
        return cls(
            input_ids=torch.as_tensor(input_ids, dtype=torch.int64).to(device),
            positions=torch.cat(positions).to(device),
            out_slots=torch.cat(out_slots).to(device),
            extend_lens=tuple(extend_lens),
            seq_lens=seq_lens,
            context_slots=tuple(context_slots),
            return_all_logits=return_all_logits,
            swa_context_slots=swa_ctx,
            swa_out_slots=swa_out,
            state_slots=None if state_slots is None else tuple(int(s) for s in state_slots),
        )

    @property
    def num_requests(self) -> int:
        return len(self.extend_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def prefix_lens(self) -> tuple[int, ...]:
        return tuple(s - e for s, e in zip(self.seq_lens, self.extend_lens, strict=True))

    @property
    def is_decode(self) -> bool:
        return all(e == 1 for e in self.extend_lens)

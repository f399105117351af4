"""The one dataclass that describes a forward step (the runner → model contract)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class WindowSlots:
    """The slots of a paged kind with its own pool and slot numbering (sliding-window layers):
    request r's context position i is slot `slot_table[r, i]` of that kind's pool (same shape as
    the batch's FULL `slot_table`; positions out of every window of the step may hold -1), and
    new token t's K/V goes to `out_slots[t]` (= its table entry)."""

    slot_table: torch.Tensor  # [R, W] int64
    out_slots: torch.Tensor  # [T] int64

    def to(self, device: torch.device | str) -> WindowSlots:
        return WindowSlots(self.slot_table.to(device), self.out_slots.to(device))


@dataclass(frozen=True)
class StateSlots:
    """The slots of a state kind (recurrent / conv layers): request r continues its state in
    slot `slots[r]`, which holds the state after exactly prefix_lens[r] tokens (ignored, zeros
    used, when prefix_lens[r] == 0) and after seq_lens[r] tokens when the forward returns."""

    slots: tuple[int, ...]  # [R]

    def to(self, device: torch.device | str) -> StateSlots:
        return self


KindSlots = WindowSlots | StateSlots


@dataclass(frozen=True)
class ForwardBatch:
    """One step over R requests, each extending its context by `extend_lens[r]` new tokens.

    New tokens of all requests are concatenated in request order (length T = sum(extend_lens));
    request r's are rows [q_start[r], q_start[r + 1]). Request r's context after this step has
    `seq_lens[r]` tokens; its first `prefix_lens[r]` (= seq_lens - extend_lens) are already in
    the KV pool (cache hit or earlier chunks/steps). `slot_table[r, i]` is the pool slot of its
    context position i, for i < seq_lens[r] (the new tokens' slots included; columns past it are
    padding, never read): the page table at the granularity of one slot (a page of P slots is
    P consecutive table entries). The attention backend writes the new tokens' K/V at
    `out_slots` (= each new token's table entry) before attending, then token i of request r
    attends to context positions <= its own position.

    Tensors are int64 on the model's device and are what a backend reads (a device kernel, a
    captured graph); the tuples `extend_lens` / `seq_lens` are their host mirror, for decisions
    made on the host (which requests are one-token, per-request loops of the eager fallbacks)
    without a device sync. The runner builds it once per step (`from_table`).

    The model never knows whether a slot came from a cache hit.

    Hybrid models (see radixkv.memory.hybrid) add the slots of their other kinds, keyed by kind
    in `kind_slots` (empty for a FULL-only model):
    - a windowed kind (SWA, window W) is a `WindowSlots` (`window(kind)`): its layers write new
      K/V at its `out_slots` and read its `slot_table` (slots of that kind's pool). Positions
      p < prefix_lens[r] - W + 1 are never read and may hold -1 (freed: out of every window).
    - a state kind (STATE) is a `StateSlots` (`states(kind)`): request r's working state slot,
      updated in place.

    `attention`, when set, is the attention metadata of this step per KV component ("full",
    "swa") prepared by the caller (a graph runner: `AttentionBackend.capture` / `replay`); the
    model then uses it instead of calling the backend's `prepare`.
    """

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, position of each new token within its request
    out_slots: torch.Tensor  # [T] int64, the pool slot each new token's K/V is written to
    slot_table: torch.Tensor  # [R, W] int64, W >= max(seq_lens): context slots per request
    seq_lens_t: torch.Tensor  # [R] int64
    prefix_lens_t: torch.Tensor  # [R] int64
    extend_lens_t: torch.Tensor  # [R] int64
    q_start: (
        torch.Tensor
    )  # [R + 1] int64: request r's new tokens are rows [q_start[r], q_start[r+1])
    extend_lens: tuple[int, ...]  # [R] host mirror
    seq_lens: tuple[int, ...]  # [R] host mirror
    return_all_logits: bool = False  # tests: logits for every new token, not only the last
    kind_slots: Mapping[str, KindSlots] = field(default_factory=dict)  # kinds besides FULL
    attention: Mapping[str, Any] | None = None  # prepared metadata per KV component

    @classmethod
    def from_table(
        cls,
        input_ids: Sequence[int] | torch.Tensor,
        slot_table: torch.Tensor,
        extend_lens: Sequence[int],
        seq_lens: Sequence[int],
        *,
        device: torch.device | str | None = None,
        return_all_logits: bool = False,
        kind_slots: Mapping[str, torch.Tensor | Sequence[int]] | None = None,
    ) -> ForwardBatch:
        """The batch whose request r has context slots `slot_table[r, :seq_lens[r]]`, the last
        `extend_lens[r]` of them new: lengths, positions and out slots follow, as tensors built
        with a few vectorized ops (no per-request work). `kind_slots[kind]`: a windowed kind's
        slot table ([R, W] tensor, its out slots follow as FULL's do) or a state kind's slot per
        request (ints)."""
        if device is None:
            device = slot_table.device
        ext, seq = tuple(int(e) for e in extend_lens), tuple(int(s) for s in seq_lens)
        if len(ext) != len(seq) or len(seq) != slot_table.shape[0]:
            raise ValueError("one extend length, one sequence length and one table row per request")
        if any(e < 1 or e > s for e, s in zip(ext, seq, strict=True)):
            raise ValueError("every request extends its context by 1..seq_len tokens")
        if seq and max(seq) > slot_table.shape[1]:
            raise ValueError("slot_table is narrower than the longest context")
        host = torch.tensor([seq, ext], dtype=torch.int64).view(2, len(seq))
        seq_t, ext_t = host[0], host[1]
        prefix_t = seq_t - ext_t
        q_start = torch.zeros(len(seq) + 1, dtype=torch.int64)
        torch.cumsum(ext_t, 0, out=q_start[1:])
        req = torch.repeat_interleave(torch.arange(len(seq)), ext_t)
        positions = torch.arange(int(q_start[-1])) - torch.repeat_interleave(
            q_start[:-1] - prefix_t, ext_t
        )
        table = slot_table.to(device).contiguous()
        req, positions = req.to(device), positions.to(device)
        kinds: dict[str, KindSlots] = {}
        for kind, given in (kind_slots or {}).items():
            if isinstance(given, torch.Tensor):
                own = given.to(device).contiguous()
                if own.shape[0] != table.shape[0]:
                    raise ValueError(f"the {kind} slot table needs one row per request")
                kinds[kind] = WindowSlots(own, own[req, positions])
            else:
                kinds[kind] = StateSlots(tuple(int(s) for s in given))
        return cls(
            input_ids=torch.as_tensor(input_ids, dtype=torch.int64).to(device),
            positions=positions,
            out_slots=table[req, positions],
            slot_table=table,
            seq_lens_t=seq_t.to(device),
            prefix_lens_t=prefix_t.to(device),
            extend_lens_t=ext_t.to(device),
            q_start=q_start.to(device),
            extend_lens=ext,
            seq_lens=seq,
            return_all_logits=return_all_logits,
            kind_slots=kinds,
        )

    @classmethod
    def from_contexts(
        cls,
        input_ids: Sequence[int] | torch.Tensor,
        context_slots: Sequence[torch.Tensor],
        extend_lens: Sequence[int],
        *,
        device: torch.device | str | None = None,
        return_all_logits: bool = False,
        kind_slots: Mapping[str, Sequence[torch.Tensor] | Sequence[int]] | None = None,
    ) -> ForwardBatch:
        """The batch in which request r's new tokens are the last `extend_lens[r]` positions of
        its context `context_slots[r]` (tests and tools; the runner uses `from_table`).
        `kind_slots[kind]`: a windowed kind's context slots per request (tensors covering the
        same positions as `context_slots`) or a state kind's slot per request (ints)."""
        seq_lens = [int(c.shape[0]) for c in context_slots]
        if device is None:
            device = context_slots[0].device if context_slots else "cpu"
        kinds: dict[str, torch.Tensor | Sequence[int]] = {}
        for kind, given in (kind_slots or {}).items():
            if not any(isinstance(c, torch.Tensor) for c in given):
                kinds[kind] = [int(s) for s in given]
                continue
            contexts = [c for c in given if isinstance(c, torch.Tensor)]
            if [int(c.shape[0]) for c in contexts] != seq_lens:
                raise ValueError(f"the {kind} context slots must cover the context's positions")
            kinds[kind] = _pad(contexts)
        return cls.from_table(
            input_ids,
            _pad(context_slots),
            extend_lens,
            seq_lens,
            device=device,
            return_all_logits=return_all_logits,
            kind_slots=kinds,
        )

    def to(self, device: torch.device | str) -> ForwardBatch:
        """This batch with its tensors on `device` (itself when they are there already)."""
        device = torch.device(device)
        if self.slot_table.device == device and self.input_ids.device == device:
            return self
        moved: dict[str, Any] = {
            f.name: getattr(self, f.name).to(device)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        moved["kind_slots"] = {kind: s.to(device) for kind, s in self.kind_slots.items()}
        return dataclasses.replace(self, **moved)

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

    @property
    def context_slots(self) -> tuple[torch.Tensor, ...]:
        """Request r's context slots, `slot_table[r, :seq_lens[r]]` (views)."""
        return tuple(self.slot_table[r, :s] for r, s in enumerate(self.seq_lens))

    def window(self, kind: str) -> WindowSlots | None:
        """The slots of windowed kind `kind` (None when the batch has none)."""
        got = self.kind_slots.get(kind)
        if got is not None and not isinstance(got, WindowSlots):
            raise TypeError(f"the {kind} slots are not a windowed kind's")
        return got

    def states(self, kind: str) -> tuple[int, ...] | None:
        """Each request's working-state slot of state kind `kind` (None when the batch has none)."""
        got = self.kind_slots.get(kind)
        if got is not None and not isinstance(got, StateSlots):
            raise TypeError(f"the {kind} slots are not a state kind's")
        return None if got is None else got.slots

    def window_context_slots(self, kind: str) -> tuple[torch.Tensor, ...] | None:
        """Request r's context slots of windowed kind `kind` (views), None when absent."""
        got = self.window(kind)
        if got is None:
            return None
        return tuple(got.slot_table[r, :s] for r, s in enumerate(self.seq_lens))


def _pad(contexts: Sequence[torch.Tensor]) -> torch.Tensor:
    """[R, max len] int64 with row r = contexts[r] then zeros."""
    width = max((int(c.shape[0]) for c in contexts), default=0)
    device = contexts[0].device if contexts else "cpu"
    table = torch.zeros((len(contexts), max(width, 1)), dtype=torch.int64, device=device)
    for r, c in enumerate(contexts):
        table[r, : c.shape[0]] = c
    return table

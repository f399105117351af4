"""The per-forward attention metadata a backend builds once from a ForwardBatch and every layer
reads: which batch rows are one-token (decode) requests and which are multi-token (extend)
requests, their context slots, the padded gather views and masks (built lazily, once per window
size and dtype, and shared by the layers), and the packed form the C++ extend kernel takes.
radixkv.model.attention's backends fill and read them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class ExtendItem:
    """One multi-token request: its new tokens are rows [start, end) of the batch, at positions
    prefix .. seq_len - 1 (the contract: a request's new tokens follow its whole context)."""

    start: int
    end: int
    prefix: int
    slots: torch.Tensor  # [seq_len] int64 context slots
    q_pos: torch.Tensor  # [end - start] positions of the new tokens
    # (window, dtype) -> additive mask [G * e, s - lo]; built on first use, shared by layers
    masks: dict[tuple[int | None, torch.dtype], torch.Tensor] = field(default_factory=dict)

    def first_key(self, window: int | None) -> int:
        """Oldest context position any new token can see (earlier keys are not gathered)."""
        return 0 if window is None else max(0, self.prefix - window + 1)


@dataclass
class DecodeView:
    """The padded context of the one-token requests as one layer with a given window sees it."""

    slots: torch.Tensor  # [Rd * width] slots, row-major, padding → slot 0 (masked)
    width: int
    valid: torch.Tensor  # [Rd, width] bool
    lens: torch.Tensor  # [Rd] int64: row r's first lens[r] slots are its context (>= 1)
    masks: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)  # additive [Rd,1,1,W]
    # Gather targets reused by every layer of the forward (dtype → (k, v) [Rd * width, KV, D]):
    # each layer's gathered K/V is consumed by its attention before the next layer gathers.
    buffers: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def gather(
        self, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This view's K/V rows of one layer, into the per-forward buffers (no allocation)."""
        bufs = self.buffers.get(k_cache.dtype)
        if bufs is None:
            shape = (self.slots.shape[0], *k_cache.shape[1:])
            bufs = self.buffers[k_cache.dtype] = (
                k_cache.new_empty(shape),
                v_cache.new_empty(shape),
            )
        torch.index_select(k_cache, 0, self.slots, out=bufs[0])
        torch.index_select(v_cache, 0, self.slots, out=bufs[1])
        return bufs


@dataclass
class DecodeGroup:
    """All one-token requests of a step, attended together in one batched call."""

    rows: torch.Tensor  # [Rd] token rows in the batch (device)
    contexts: list[torch.Tensor]  # each request's context slots (host copies)
    device: torch.device
    views: dict[int | None, DecodeView] = field(default_factory=dict)

    def view(self, window: int | None) -> DecodeView:
        """Built once per window per forward. The query of a request with L context tokens sits
        at position L - 1 and sees positions > L - 1 - window: exactly its last min(L, window)
        tokens, so only those are gathered and only the padding needs masking."""
        longest = max(c.numel() for c in self.contexts)
        key = None if window is None or window >= longest else window
        cached = self.views.get(key)
        if cached is not None:
            return cached
        tails = [c if key is None else c[max(0, c.numel() - key) :] for c in self.contexts]
        width = max(t.numel() for t in tails)
        padded = torch.zeros((len(tails), width), dtype=torch.int64)
        for i, tail in enumerate(tails):
            padded[i, : tail.numel()] = tail
        lens = torch.tensor([t.numel() for t in tails], dtype=torch.int64)
        valid = torch.arange(width)[None, :] < lens[:, None]
        view = DecodeView(
            padded.reshape(-1).to(self.device), width, valid.to(self.device), lens.to(self.device)
        )
        self.views[key] = view
        return view


@dataclass
class PackedExtends:
    """The multi-token requests of a forward as the C++ extend kernel takes them: their contexts'
    slots concatenated, and per request the context's offset in them, its first batch row, its
    new-token count and the position of its first new token (all int64, on the CPU)."""

    slots: torch.Tensor
    ctx_start: torch.Tensor
    q_start: torch.Tensor
    new_len: torch.Tensor
    prefix: torch.Tensor

    def args(self) -> tuple[torch.Tensor, ...]:
        return (self.slots, self.ctx_start, self.q_start, self.new_len, self.prefix)

    @classmethod
    def of(cls, extends: list[ExtendItem]) -> PackedExtends:
        lens = [item.slots.numel() for item in extends]
        starts = [0]
        for n in lens[:-1]:
            starts.append(starts[-1] + n)

        def ints(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64)

        return cls(
            slots=torch.cat([item.slots for item in extends]),
            ctx_start=ints(starts),
            q_start=ints([item.start for item in extends]),
            new_len=ints([item.end - item.start for item in extends]),
            prefix=ints([item.prefix for item in extends]),
        )


@dataclass
class AttentionMetadata:
    """Per-forward state shared by all layers (gathers and masks are built lazily, once per
    window size and dtype)."""

    num_tokens: int
    decode: DecodeGroup | None
    extends: list[ExtendItem]
    packed: PackedExtends | None = None  # set when the C++ extend kernel serves this forward

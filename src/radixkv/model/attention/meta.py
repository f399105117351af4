"""The per-step metadata `TorchAttention` builds once from a ForwardBatch (one KV component's
view of it) and every layer reads: where this step's K/V go, the one-token (decode) requests'
rows, slot-table rows and lengths, and the multi-token (extend) requests in the packed form the
C++ extend kernel takes. All of it is a few index ops on the batch's tensors, chosen by the host
mirror of the lengths; what only the torch fallbacks need (padded gather views, masks, per-request
items) is built on first use, once per window size and dtype, and shared by the layers."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixkv.model.batch import ForwardBatch


@dataclass
class ExtendItem:
    """One multi-token request, for the per-request torch fallback: its new tokens are rows
    [start, end) of the batch, at positions prefix .. seq_len - 1."""

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
    """The padded context of the one-token requests as one layer with a given window sees it
    (the gather + SDPA fallback's input)."""

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

    rows: torch.Tensor  # [Rd] their token rows in the batch
    slots: torch.Tensor  # [Rd, W] their slot-table rows (row r's first lens[r] are its context)
    lens: torch.Tensor  # [Rd] int64 context lengths
    longest: int  # max(lens), from the host mirror
    views: dict[int | None, DecodeView] = field(default_factory=dict)

    def view(self, window: int | None) -> DecodeView:
        """Built once per window per forward. The query of a request with L context tokens sits
        at position L - 1 and sees positions > L - 1 - window: exactly its last min(L, window)
        tokens, so only those are gathered (left-aligned) and only the padding needs masking."""
        key = None if window is None or window >= self.longest else window
        cached = self.views.get(key)
        if cached is not None:
            return cached
        width = self.longest if key is None else key
        tail = self.lens.clamp(max=width)
        cols = torch.arange(width, device=self.slots.device)
        valid = cols[None, :] < tail[:, None]
        index = ((self.lens - tail)[:, None] + cols[None, :]).clamp(max=self.slots.shape[1] - 1)
        padded = self.slots.gather(1, index).masked_fill(~valid, 0)
        view = self.views[key] = DecodeView(padded.reshape(-1), width, valid, tail)
        return view


@dataclass
class PackedExtends:
    """The multi-token requests of a step as the C++ extend kernel takes them: `slots` is the
    whole slot table, flattened, and per request the offset of its row in it, its first batch
    row, its new-token count and the position of its first new token (int64, contiguous)."""

    slots: torch.Tensor
    ctx_start: torch.Tensor
    q_start: torch.Tensor
    new_len: torch.Tensor
    prefix: torch.Tensor

    def args(self) -> tuple[torch.Tensor, ...]:
        return (self.slots, self.ctx_start, self.q_start, self.new_len, self.prefix)

    @classmethod
    def of(cls, batch: ForwardBatch, requests: list[int]) -> PackedExtends:
        table = batch.slot_table.contiguous()
        width, device = table.shape[1], table.device
        if len(requests) == batch.num_requests:  # every request: the batch's own tensors
            return cls(
                slots=table.view(-1),
                ctx_start=torch.arange(len(requests), device=device) * width,
                q_start=batch.q_start[:-1],
                new_len=batch.extend_lens_t,
                prefix=batch.prefix_lens_t,
            )
        idx = torch.tensor(requests, dtype=torch.int64).to(device)
        return cls(
            slots=table.view(-1),
            ctx_start=idx * width,
            q_start=batch.q_start.index_select(0, idx),
            new_len=batch.extend_lens_t.index_select(0, idx),
            prefix=batch.prefix_lens_t.index_select(0, idx),
        )


@dataclass
class AttentionMetadata:
    """One step's metadata for one KV component (`TorchAttention.prepare`)."""

    batch: ForwardBatch  # the component's view of the step it was built from
    out_slots: torch.Tensor  # [T] where write_kv stores this step's K/V
    num_tokens: int
    decode: DecodeGroup | None
    packed: PackedExtends | None  # the multi-token requests, or None when there are none
    extend_requests: list[int]  # their indices in the batch
    _items: list[ExtendItem] | None = None

    @property
    def has_extends(self) -> bool:
        return self.packed is not None

    def extend_items(self) -> list[ExtendItem]:
        """The multi-token requests one by one (the torch fallback), built on first use."""
        if self._items is None:
            b = self.batch
            starts = [0]
            for e in b.extend_lens:
                starts.append(starts[-1] + e)
            self._items = [
                ExtendItem(
                    start=starts[r],
                    end=starts[r + 1],
                    prefix=b.seq_lens[r] - b.extend_lens[r],
                    slots=b.slot_table[r, : b.seq_lens[r]],
                    q_pos=b.positions[starts[r] : starts[r + 1]],
                )
                for r in self.extend_requests
            ]
        return self._items

    @classmethod
    def of(cls, batch: ForwardBatch) -> AttentionMetadata:
        """Split the step into its one-token and multi-token requests (host decisions on the
        host mirror; index ops on the batch's tensors)."""
        n = batch.num_requests
        dec = [r for r, e in enumerate(batch.extend_lens) if e == 1]
        ext = [r for r, e in enumerate(batch.extend_lens) if e > 1]
        decode = None
        if dec:
            if len(dec) == n:
                rows, slots, lens = batch.q_start[:-1], batch.slot_table, batch.seq_lens_t
            else:
                idx = torch.tensor(dec, dtype=torch.int64).to(batch.slot_table.device)
                rows = batch.q_start.index_select(0, idx)
                slots = batch.slot_table.index_select(0, idx)
                lens = batch.seq_lens_t.index_select(0, idx)
            longest = max(batch.seq_lens[r] for r in dec)
            decode = DecodeGroup(rows, slots, lens, longest)
        return cls(
            batch=batch,
            out_slots=batch.out_slots,
            num_tokens=batch.num_tokens,
            decode=decode,
            packed=PackedExtends.of(batch, ext) if ext else None,
            extend_requests=ext,
        )

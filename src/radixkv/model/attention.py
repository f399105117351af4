"""Attention over the slot-indexed KV pool, behind a small backend interface.

A backend turns one ForwardBatch into per-forward metadata once (`prepare`), then for every layer
attends the new tokens' queries to their requests' context K/V, read from the pool by slot index
(`attend`). The model writes the new K/V into the pool before calling `attend`, so a request's
context (cached prefix, earlier chunks, and this step's tokens) is always complete in the pool.

`TorchAttention` (CPU and any torch device) splits a batch in two groups:
- one-token requests (decode) run together: their context slots are padded to the longest context,
  gathered in one index_select, and attended with one batched matmul under a padding mask;
- multi-token requests (prefill / chunked prefill) run one by one with a causal mask by position.
Grouped-query attention is done by reshaping queries to [kv_heads, group, ...]; K/V are never
repeated. Softmax runs in float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from radixkv.engine.batch import ForwardBatch

NEG_INF = float("-inf")


@dataclass
class ExtendItem:
    """One multi-token request: its new tokens are rows [start, end) of the batch."""

    start: int
    end: int
    slots: torch.Tensor  # [seq_len] int64 context slots
    q_pos: torch.Tensor  # [end - start] positions of the new tokens
    masks: dict[int | None, torch.Tensor] = field(default_factory=dict)  # window -> [e, s] bias


@dataclass
class AttentionMetadata:
    """Per-forward state shared by all layers (masks are built lazily, once per window size)."""

    num_tokens: int
    decode_rows: torch.Tensor | None  # [Rd] token rows of the one-token requests
    decode_slots: torch.Tensor | None  # [Rd * Smax] padded context slots, flattened
    decode_lens: torch.Tensor | None  # [Rd] context lengths
    decode_pos: torch.Tensor | None  # [Rd] query positions
    decode_width: int
    extends: list[ExtendItem]
    decode_masks: dict[int | None, torch.Tensor] = field(default_factory=dict)


class AttentionBackend(Protocol):
    """What the model needs from an attention implementation."""

    name: str

    def prepare(self, batch: ForwardBatch, device: torch.device) -> AttentionMetadata: ...

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        window: int | None,
        scale: float,
    ) -> torch.Tensor:
        """q [T, H, D] → output [T, H, D]; k_cache/v_cache are one layer's [slots, KV, D]."""
        ...


def _bias(allowed: torch.Tensor) -> torch.Tensor:
    """Additive float32 mask: 0 where allowed, -inf elsewhere."""
    return torch.zeros(allowed.shape, dtype=torch.float32, device=allowed.device).masked_fill_(
        ~allowed, NEG_INF
    )


def _allowed(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Causal (and sliding-window) visibility: key at p_k is visible to query at p_q iff
    p_k <= p_q and, with a window w, p_k > p_q - w (HF semantics)."""
    ok = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        ok &= k_pos[None, :] > q_pos[:, None] - window
    return ok


class TorchAttention:
    """Gather + matmul/softmax attention; see the module docstring for the batching scheme."""

    name = "torch"

    def prepare(self, batch: ForwardBatch, device: torch.device) -> AttentionMetadata:
        positions = batch.positions.to(device)
        starts = [0]
        for e in batch.extend_lens:
            starts.append(starts[-1] + e)
        decode_ids = [r for r, e in enumerate(batch.extend_lens) if e == 1]
        extends = [
            ExtendItem(
                start=starts[r],
                end=starts[r + 1],
                slots=batch.context_slots[r].to(device),
                q_pos=positions[starts[r] : starts[r + 1]],
            )
            for r, e in enumerate(batch.extend_lens)
            if e > 1
        ]
        meta = AttentionMetadata(
            num_tokens=batch.num_tokens,
            decode_rows=None,
            decode_slots=None,
            decode_lens=None,
            decode_pos=None,
            decode_width=0,
            extends=extends,
        )
        if decode_ids:
            lens = [batch.seq_lens[r] for r in decode_ids]
            width = max(lens)
            # Padding slots point at slot 0 (always a valid row); the mask hides them.
            padded = torch.zeros((len(decode_ids), width), dtype=torch.int64)
            for i, r in enumerate(decode_ids):
                padded[i, : lens[i]] = batch.context_slots[r].to("cpu")
            rows = torch.tensor([starts[r] for r in decode_ids], dtype=torch.int64)
            meta.decode_rows = rows.to(device)
            meta.decode_slots = padded.reshape(-1).to(device)
            meta.decode_lens = torch.tensor(lens, dtype=torch.int64, device=device)
            meta.decode_pos = positions[meta.decode_rows]
            meta.decode_width = width
        return meta

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        window: int | None,
        scale: float,
    ) -> torch.Tensor:
        if meta.decode_rows is not None and not meta.extends:
            return self._decode(q, k_cache, v_cache, meta, window, scale)
        out = torch.empty_like(q)
        for item in meta.extends:
            out[item.start : item.end] = self._extend(q, k_cache, v_cache, item, window, scale)
        if meta.decode_rows is not None:
            q_dec = q.index_select(0, meta.decode_rows)
            dec = self._decode(q_dec, k_cache, v_cache, meta, window, scale)
            out.index_copy_(0, meta.decode_rows, dec)
        return out

    def _decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        window: int | None,
        scale: float,
    ) -> torch.Tensor:
        """q [Rd, H, D]: the one-token requests' queries, in request order."""
        assert meta.decode_slots is not None and meta.decode_lens is not None
        assert meta.decode_pos is not None
        r, h, d = q.shape
        kv = k_cache.shape[1]
        width = meta.decode_width
        bias = meta.decode_masks.get(window)
        if bias is None:
            k_pos = torch.arange(width, device=q.device)
            ok = k_pos[None, :] < meta.decode_lens[:, None]
            if window is not None:
                ok &= k_pos[None, :] > meta.decode_pos[:, None] - window
            bias = _bias(ok)[:, None, None, :]  # [R, 1, 1, W]
            meta.decode_masks[window] = bias
        k = k_cache.index_select(0, meta.decode_slots).view(r, width, kv, d).transpose(1, 2)
        v = v_cache.index_select(0, meta.decode_slots).view(r, width, kv, d).transpose(1, 2)
        qg = q.view(r, kv, h // kv, d)
        scores = torch.matmul(qg, k.transpose(-1, -2)).float() * scale + bias
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        return torch.matmul(probs, v).reshape(r, h, d)

    def _extend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        item: ExtendItem,
        window: int | None,
        scale: float,
    ) -> torch.Tensor:
        e = item.end - item.start
        s = item.slots.shape[0]
        h, d = q.shape[1], q.shape[2]
        kv = k_cache.shape[1]
        g = h // kv
        bias = item.masks.get(window)
        if bias is None:
            k_pos = torch.arange(s, device=q.device)
            bias = _bias(_allowed(item.q_pos, k_pos, window))  # [e, s]
            item.masks[window] = bias
        k = k_cache.index_select(0, item.slots).transpose(0, 1)  # [KV, s, D]
        v = v_cache.index_select(0, item.slots).transpose(0, 1)
        qg = q[item.start : item.end].view(e, kv, g, d).permute(1, 2, 0, 3).reshape(kv, g * e, d)
        scores = torch.matmul(qg, k.transpose(-1, -2)).float().view(kv, g, e, s) * scale + bias
        probs = torch.softmax(scores, dim=-1).to(v.dtype).view(kv, g * e, s)
        out = torch.matmul(probs, v).view(kv, g, e, d)  # [KV, G, e, D]
        return out.permute(2, 0, 1, 3).reshape(e, h, d)


def select_backend(device: str | torch.device) -> AttentionBackend:
    """The attention backend for `device` (torch everywhere for now; kernels plug in here)."""
    return TorchAttention()

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
repeated. With a sliding window, only the keys some new token can still see are gathered (the
last `window` per decode request; from `prefix - window + 1` on for an extend), so a windowed
layer's cost stays O(window) however long the context grows. The kernel on the gathered tensors
is torch SDPA (default) or matmul + float32 softmax.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F

from radixkv.model.attention_meta import (
    AttentionMetadata,
    DecodeGroup,
    DecodeView,
    ExtendItem,
    PackedExtends,
)
from radixkv.model.batch import ForwardBatch

if TYPE_CHECKING:
    from radixkv.model.kernels import DecodeKernel, ExtendKernel

__all__ = [  # the metadata types live in radixkv.model.attention_meta; importable here too
    "AttentionBackend",
    "AttentionMetadata",
    "DecodeGroup",
    "DecodeView",
    "ExtendItem",
    "PackedExtends",
    "TorchAttention",
    "select_backend",
]

NEG_INF = float("-inf")
# `enable_gqa` arrived in torch 2.5; older versions repeat K/V per query head instead.
_HAS_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


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


def _allowed(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Causal (and sliding-window) visibility: key at p_k is visible to query at p_q iff
    p_k <= p_q and, with a window w, p_k > p_q - w (HF semantics)."""
    ok = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        ok &= k_pos[None, :] > q_pos[:, None] - window
    return ok


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where allowed, -inf elsewhere. Every query row allows at least its own key, so no row
    is fully masked (a fully masked row would turn softmax into NaN)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, NEG_INF
    )


def _attend_core(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, sdpa: bool
) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v over the last two dims; batch dims broadcast."""
    if sdpa:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), scale=scale)
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale + mask
    return torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)


class TorchAttention:
    """Gather + attention in plain torch; see the module docstring for the batching scheme.

    kernel="sdpa" runs torch's scaled_dot_product_attention on the gathered K/V, "matmul" an
    explicit matmul + float32 softmax. Both see identical inputs and masks; on this project's
    CPUs SDPA measured faster for both prefill and one-query decode, in float32 and bfloat16
    (numbers in `radixkv.model.microbench`), so it is the default.

    `decode_kernel`, when given (the C++ CPU kernel of `radixkv.model.kernels`), replaces gather +
    SDPA for the one-token requests: it reads each context's K/V rows in place from the pool,
    with float32 softmax and accumulation (about 2x faster per layer than gather + SDPA for 8
    requests of 266 tokens; a whole float32 decode step 42 -> 36 ms, measured with
    `RADIXKV_CPU_KERNELS=0 / 1 python -m radixkv.model.microbench --steps-ab compiled`).

    `extend_kernel` likewise replaces gather + SDPA for all multi-token requests of a forward in
    one call (flash-attention style over K/V read in place, causal and windowed; float32
    softmax and accumulation; bf16 pools multiply bf16 pairs with AVX-512 BF16 dot products where
    the CPU has them): a 1,088-token causal prefill's attention per layer, gather + SDPA 12.1 ->
    4.1 ms in float32 and 12.7 -> 2.6 ms in bfloat16 (`python -m radixkv.model.microbench
    --skip-model --prefill-len 1088`, 2 threads).
    """

    name = "torch"

    def __init__(
        self,
        kernel: str = "sdpa",
        decode_kernel: DecodeKernel | None = None,
        extend_kernel: ExtendKernel | None = None,
    ) -> None:
        if kernel not in ("sdpa", "matmul"):
            raise ValueError(f"unknown attention kernel {kernel!r}")
        self.kernel = kernel
        self.decode_kernel = decode_kernel
        self.extend_kernel = extend_kernel
        self.name = (
            f"torch-{kernel}"
            + ("+cpp-decode" if decode_kernel is not None else "")
            + ("+cpp-extend" if extend_kernel is not None else "")
        )

    def prepare(self, batch: ForwardBatch, device: torch.device) -> AttentionMetadata:
        positions = batch.positions.to(device)
        starts = [0]
        for e in batch.extend_lens:
            starts.append(starts[-1] + e)
        extends = [
            ExtendItem(
                start=starts[r],
                end=starts[r + 1],
                prefix=batch.seq_lens[r] - e,
                slots=batch.context_slots[r].to(device),
                q_pos=positions[starts[r] : starts[r + 1]],
            )
            for r, e in enumerate(batch.extend_lens)
            if e > 1
        ]
        decode_ids = [r for r, e in enumerate(batch.extend_lens) if e == 1]
        decode = None
        if decode_ids:
            decode = DecodeGroup(
                rows=torch.tensor([starts[r] for r in decode_ids], dtype=torch.int64).to(device),
                contexts=[batch.context_slots[r].to("cpu") for r in decode_ids],
                device=device,
            )
        packed = None
        if extends and self.extend_kernel is not None and torch.device(device).type == "cpu":
            packed = PackedExtends.of(extends)
        return AttentionMetadata(
            num_tokens=batch.num_tokens, decode=decode, extends=extends, packed=packed
        )

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        window: int | None,
        scale: float,
    ) -> torch.Tensor:
        if meta.decode is not None and not meta.extends:
            return self._decode(q, k_cache, v_cache, meta.decode, window, scale)
        p = meta.packed
        d = q.shape[-1]
        if p is not None and self.extend_kernel is not None and d % 16 == 0 and d <= 256:
            # Rows of one-token requests are left unset here and filled below.
            out = self.extend_kernel(q, k_cache, v_cache, *p.args(), window or 0, scale)
        else:
            out = torch.empty_like(q)
            for item in meta.extends:
                out[item.start : item.end] = self._extend(q, k_cache, v_cache, item, window, scale)
        if meta.decode is not None:
            q_dec = q.index_select(0, meta.decode.rows)
            dec = self._decode(q_dec, k_cache, v_cache, meta.decode, window, scale)
            out.index_copy_(0, meta.decode.rows, dec)
        return out

    def _decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        group: DecodeGroup,
        window: int | None,
        scale: float,
    ) -> torch.Tensor:
        """q [Rd, H, D]: the one-token requests' queries, in request order.

        The G query heads that share a KV head act as G "query rows" of one attention problem
        per (request, KV head), so K/V are used as gathered, never repeated per query head."""
        r, h, d = q.shape
        kv = k_cache.shape[1]
        if self.decode_kernel is not None and k_cache.device.type == "cpu":
            # The kernel takes each whole context and the window: it aligns its key blocks at
            # absolute positions, as the extend kernel does (see decode_canon.h).
            full = group.view(None)
            slots = full.slots.view(r, full.width)
            return self.decode_kernel(q, k_cache, v_cache, slots, full.lens, window or 0, scale)
        view = group.view(window)
        dtype = q.dtype if self.kernel == "sdpa" else torch.float32
        mask = view.masks.get(dtype)
        if mask is None:
            mask = view.masks[dtype] = _additive(view.valid, dtype)[:, None, None, :]
        k_rows, v_rows = view.gather(k_cache, v_cache)
        k = k_rows.view(r, view.width, kv, d).transpose(1, 2)
        v = v_rows.view(r, view.width, kv, d).transpose(1, 2)
        out = _attend_core(q.view(r, kv, h // kv, d), k, v, mask, scale, self.kernel == "sdpa")
        return out.reshape(r, h, d)

    def _extend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        item: ExtendItem,
        window: int | None,
        scale: float,
    ) -> torch.Tensor:
        """One request's e new queries against its s context keys."""
        e = item.end - item.start
        h, d = q.shape[1], q.shape[2]
        kv = k_cache.shape[1]
        g = h // kv
        slots = item.slots[item.first_key(window) :]
        k = k_cache.index_select(0, slots).transpose(0, 1)  # [KV, s', D]
        v = v_cache.index_select(0, slots).transpose(0, 1)
        q_r = q[item.start : item.end]
        if self.kernel == "sdpa":
            # Heads-major 4D layout: SDPA's CPU flash kernel tiles the query dim per head, and a
            # fresh sequence (no prefix, no window) uses its built-in causal mask.
            causal = window is None and item.prefix == 0
            mask = None if causal else self._mask(item, window, q.dtype, 1)
            out = _sdpa(q_r.transpose(0, 1)[None], k[None], v[None], mask, scale, causal)
            return out[0].transpose(0, 1)
        # Queries grouped per KV head as [KV, G * e, D] (rows g*e + i): K/V are never repeated.
        qg = q_r.view(e, kv, g, d).permute(1, 2, 0, 3).reshape(kv, g * e, d)
        mask = self._mask(item, window, torch.float32, g)
        out = _attend_core(qg, k, v, mask, scale, sdpa=False).view(kv, g, e, d)
        return out.permute(2, 0, 1, 3).reshape(e, h, d)

    @staticmethod
    def _mask(
        item: ExtendItem, window: int | None, dtype: torch.dtype, repeat: int
    ) -> torch.Tensor:
        """Additive mask [repeat * e, s] for this request, built once per forward and reused."""
        key = (window, dtype)
        mask = item.masks.get(key)
        if mask is None:
            k_pos = torch.arange(
                item.first_key(window), item.slots.shape[0], device=item.q_pos.device
            )
            mask = _additive(_allowed(item.q_pos, k_pos, window), dtype).repeat(repeat, 1)
            item.masks[key] = mask
        return mask


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    causal: bool,
) -> torch.Tensor:
    """SDPA with grouped-query K/V ([B, KV, s, D] for [B, H, e, D] queries)."""
    if k.shape[1] != q.shape[1]:
        if _HAS_GQA:
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True
            )
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)


def select_backend(device: str | torch.device) -> AttentionBackend:
    """The attention backend for `device`: torch (kernel from $RADIXKV_ATTENTION_KERNEL,
    "sdpa" by default, or "matmul"), on CPU with the C++ decode and extend kernels where they build
    ($RADIXKV_CPU_KERNELS=0 turns it off); accelerator kernels plug in here."""
    decode = extend = None
    if torch.device(device).type == "cpu":
        from radixkv.model.kernels import decode_attention, extend_attention

        decode, extend = decode_attention(), extend_attention()
    return TorchAttention(os.environ.get("RADIXKV_ATTENTION_KERNEL", "sdpa"), decode, extend)

"""`TorchAttention`: the CPU backend (C++ kernels) and the plain-torch backend for any device.

It splits a step's requests in two groups:
- one-token requests (decode) run together: on the CPU the C++ decode kernel reads each
  context's K/V in place through the slot table; elsewhere (or without the kernels) their
  context slots are padded to the longest context, gathered in one index_select, and attended
  with one batched matmul under a padding mask;
- multi-token requests (prefill / chunked prefill) run in one call of the C++ extend kernel over
  the whole slot table, or one by one with a causal mask by position (the torch fallback).
Grouped-query attention is done by reshaping queries to [kv_heads, group, ...]; K/V are never
repeated. With a sliding window, the fallback gathers only the keys some new token can still see
(the last `window` per decode request; from `prefix - window + 1` on for an extend), so a
windowed layer's cost stays O(window) however long the context grows. The fallback's kernel on
the gathered tensors is torch SDPA (default) or matmul + float32 softmax.

The KV write is this backend's (`write_kv`: index_copy_ into the layer's pool tensors at the
step's out slots). On the CPU path where the Llama family's layer stack runs as one C++ call
(radixkv.model.nn.native_stack), that stack makes the same write and the same kernel calls inside
its layer loop, from the arguments `stack_args` hands it: the native stack is this backend's
fused form, so the write stays the backend's there too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from radixkv.model.attention.backend import write_slots
from radixkv.model.attention.meta import AttentionMetadata, DecodeGroup, ExtendItem
from radixkv.model.batch import ForwardBatch

if TYPE_CHECKING:
    from radixkv.model.kernels import DecodeKernel, ExtendKernel

NEG_INF = float("-inf")
# `enable_gqa` arrived in torch 2.5; older versions repeat K/V per query head instead.
_HAS_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


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
    (numbers in `radixkv.bench.microbench`), so it is the default.

    `decode_kernel`, when given (the C++ CPU kernel of `radixkv.model.kernels`), replaces gather +
    SDPA for the one-token requests: it reads each context's K/V rows in place from the pool,
    with float32 softmax and accumulation (about 2x faster per layer than gather + SDPA for 8
    requests of 266 tokens; a whole float32 decode step 42 -> 36 ms, measured with
    `RADIXKV_CPU_KERNELS=0 / 1 python -m radixkv.bench.microbench --steps-ab compiled`).

    `extend_kernel` likewise replaces gather + SDPA for all multi-token requests of a forward in
    one call (flash-attention style over K/V read in place, causal and windowed; float32
    softmax and accumulation; bf16 pools multiply bf16 pairs with AVX-512 BF16 dot products where
    the CPU has them): a 1,088-token causal prefill's attention per layer, gather + SDPA 12.1 ->
    4.1 ms in float32 and 12.7 -> 2.6 ms in bfloat16 (`python -m radixkv.bench.microbench
    --skip-model --prefill-len 1088`, 2 threads).
    """

    name = "torch"
    supports_graphs = False  # capture / replay run eagerly (see radixkv.model.attention.backend)

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

    def prepare(self, batch: ForwardBatch) -> AttentionMetadata:
        return AttentionMetadata.of(batch)

    def write_kv(
        self,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
    ) -> None:
        write_slots(k_cache, v_cache, k, v, meta.out_slots)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        window: int | None,
        scale: float,
    ) -> torch.Tensor:
        self.write_kv(k_cache, v_cache, k, v, meta)
        return self.attend(q, k_cache, v_cache, meta, window, scale)

    def capture(self, batch: ForwardBatch, max_context: int) -> AttentionMetadata:
        """Eager: the step's metadata (this backend is never captured in a graph)."""
        return self.prepare(batch)

    def replay(self, meta: AttentionMetadata, batch: ForwardBatch) -> None:
        """Eager: `meta` becomes `prepare(batch)`, in place."""
        fresh = self.prepare(batch)
        meta.__dict__.update(fresh.__dict__)

    def stack_args(self, meta: AttentionMetadata) -> tuple[object, ...]:
        """What the native C++ layer stack takes for this step (kernels/stack.cpp `forward`
        after the pools): out slots (it writes K/V there, as `write_kv` does), the one-token
        requests' rows, slot-table rows and lengths (or None), and the packed extend arguments
        (or an empty list)."""
        dec = meta.decode
        ext = list(meta.packed.args()) if meta.packed is not None else []
        if dec is None:
            return (meta.out_slots, None, None, None, ext)
        return (meta.out_slots, dec.rows, dec.slots, dec.lens, ext)

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        window: int | None,
        scale: float,
    ) -> torch.Tensor:
        if meta.decode is not None and not meta.has_extends:
            return self._decode(q, k_cache, v_cache, meta.decode, window, scale)
        p = meta.packed
        d = q.shape[-1]
        kernel = self.extend_kernel if k_cache.device.type == "cpu" else None
        if p is not None and kernel is not None and d % 16 == 0 and d <= 256:
            # Rows of one-token requests are left unset here and filled below.
            out = kernel(q, k_cache, v_cache, *p.args(), window or 0, scale)
        else:
            out = torch.empty_like(q)
            for item in meta.extend_items():
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
            return self.decode_kernel(
                q, k_cache, v_cache, group.slots, group.lens, window or 0, scale
            )
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

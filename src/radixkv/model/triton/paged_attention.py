"""Launchers of the paged-attention kernels: input checks, the grid, the partials workspace.

All three entry points run the same two kernels (`kernels.py`) and differ only in how many parts
a tile's splits are spread over, which never changes a bit of the result:

- `paged_attention(..., num_parts)`: the general form;
- `extend_attention`: one part per tile (prefill, chunked prefill, any mix with decodes);
- `decode_attention`: one token per request, parts enough for its longest context, so long
  contexts run split-K (`decode_parts`).

Inputs (one layer):
- q [T, H, D]: the new tokens of R requests, request r's at rows [q_start[r], q_start[r + 1]);
- k_cache, v_cache [slots, KV, D]: the layer's pool tensors (H a multiple of KV);
- table [R, W] int32/int64: with page_size 1 the slot of context position i of request r is
  table[r, i] (the ForwardBatch's slot table); with page_size P > 1 table holds page ids and the
  slot is table[r, i // P] * P + i % P;
- seq_lens [R]: context lengths after this step (new tokens included, their K/V already in the
  pool), so request r's new tokens sit at positions seq_lens[r] - extend_len .. seq_lens[r] - 1;
- q_start [R + 1]: row offsets (q_start[0] = 0, q_start[R] = T);
- window: None, or W >= 1 (key p visible to a query at q iff p <= q and p > q - W);
- scale: the softmax scale (scores = q . k * scale).
Every index tensor lives on q's device; nothing here reads them on the host, so a call never
waits for the device (the checks that need their values run only on CPU tensors).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import NoReturn

import torch

from radixkv.model.triton.interpreter import index_fix, interpreting

KV_SPLIT = 512  # keys per split, at absolute positions (a multiple of BLOCK_N)
BLOCK_M = 64  # rows per tile: tokens x the G heads of a KV head
BLOCK_N = 64  # keys per block, at absolute positions
BLOCK_R = 16  # rows per combine program (64 under the interpreter: fewer, slow, programs;
# the combine's arithmetic is per element, so its row count changes no bit)
LOG2E = 1.4426950408889634
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INDEX = (torch.int32, torch.int64)


def kernels_for(device: torch.device) -> ModuleType:
    """The kernels module, checked against the tensors' device: compiled kernels take CUDA
    tensors, interpreted ones (TRITON_INTERPRET=1 before triton's import) take any."""
    from radixkv.model.triton import kernels

    if interpreting():
        index_fix()
    elif device.type != "cuda":
        _fail(f"tensors on {device} need Triton's interpreter (TRITON_INTERPRET=1 set before "
              "triton is imported) or a CUDA device")  # fmt: skip
    return kernels


def launch_config(head_dim: int) -> dict[str, int | bool]:
    """Launch options: a function of the head dim only (every call of a model's layers compiles
    the same kernel), with FMA contraction off so `merge`'s arithmetic is the same in both
    kernels."""
    return {
        "num_warps": 8 if head_dim > 128 else 4,
        "num_stages": 2,
        "enable_fp_fusion": False,
    }


def decode_parts(max_seq_len: int, window: int | None = None) -> int:
    """Parts for contexts of up to max_seq_len keys: one per split a query can touch (a window of
    W keys touches at most (W + KV_SPLIT - 2) // KV_SPLIT + 1). A hint only: the last part of a
    tile takes every split left, so a short count is still exact, only less parallel."""
    n = max(1, -(-max_seq_len // KV_SPLIT))
    if window is not None:
        n = min(n, (window + KV_SPLIT - 2) // KV_SPLIT + 1)
    return n


def _fail(message: str) -> NoReturn:
    raise ValueError(f"paged attention: {message}")


def _check_tensors(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    seq_lens: torch.Tensor,
    q_start: torch.Tensor,
) -> None:
    if q.dim() != 3 or k_cache.dim() != 3 or v_cache.dim() != 3:
        _fail(f"q must be [T, H, D] and k/v caches [slots, KV, D], got {q.shape=} "
              f"{k_cache.shape=} {v_cache.shape=}")  # fmt: skip
    if k_cache.shape != v_cache.shape:
        _fail(f"k and v caches differ in shape: {tuple(k_cache.shape)} vs {tuple(v_cache.shape)}")
    if q.dtype not in DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        _fail(f"q, k, v must share one dtype of {DTYPES}, got {q.dtype}, {k_cache.dtype}, "
              f"{v_cache.dtype}")  # fmt: skip
    (_, heads, dim), kv, kdim = q.shape, k_cache.shape[1], k_cache.shape[2]
    if dim != kdim:
        _fail(f"q's head dim {dim} differs from the caches' {kdim}")
    if dim % 16 or not 16 <= dim <= 256:
        _fail(f"head dim must be a multiple of 16 in [16, 256], got {dim}")
    if kv == 0 or heads % kv:
        _fail(f"query heads ({heads}) must be a multiple of KV heads ({kv})")
    if heads // kv > BLOCK_M:
        _fail(f"at most {BLOCK_M} query heads per KV head, got {heads // kv}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            _fail(f"{name}'s last dim must be contiguous")
    if table.dim() != 2 or table.dtype not in _INDEX or table.stride(-1) != 1:
        _fail(f"table must be [R, W] int32/int64 with contiguous rows, got {table.dtype} "
              f"{tuple(table.shape)}")  # fmt: skip
    reqs = table.shape[0]
    if seq_lens.shape != (reqs,) or seq_lens.dtype not in _INDEX:
        _fail(f"seq_lens must be [R] = [{reqs}] int32/int64, got {seq_lens.dtype} "
              f"{tuple(seq_lens.shape)}")  # fmt: skip
    if q_start.shape != (reqs + 1,) or q_start.dtype not in _INDEX:
        _fail(f"q_start must be [R + 1] = [{reqs + 1}] int32/int64, got {q_start.dtype} "
              f"{tuple(q_start.shape)}")  # fmt: skip
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("table", table),
                    ("seq_lens", seq_lens), ("q_start", q_start)):  # fmt: skip
        if t.device != q.device:
            _fail(f"{name} is on {t.device}, q on {q.device}")


def _check_values(
    q: torch.Tensor, table: torch.Tensor, seq_lens: torch.Tensor, q_start: torch.Tensor, page: int
) -> None:
    """The index tensors' contents (CPU tensors only: on a device this would wait for it)."""
    starts, lens = q_start.tolist(), seq_lens.tolist()
    if starts[0] != 0 or starts[-1] != q.shape[0]:
        _fail(f"q_start must run from 0 to T = {q.shape[0]}, got {starts[0]}..{starts[-1]}")
    for r, n in enumerate(lens):
        new = starts[r + 1] - starts[r]
        if new < 1 or new > n:
            _fail(f"request {r} has {new} new tokens and a context of {n}: need 1 <= new <= ctx")
        if -(-n // page) > table.shape[1]:
            _fail(f"request {r}'s context of {n} needs more than the table's {table.shape[1]} "
                  f"columns")  # fmt: skip


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    seq_lens: torch.Tensor,
    q_start: torch.Tensor,
    *,
    scale: float,
    window: int | None = None,
    page_size: int = 1,
    num_parts: int = 1,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of q's rows to their requests' contexts in the pool; returns out [T, H, D] in
    q's dtype. Same bits for a row whatever the batch, chunking, cache hit or num_parts."""
    _check_tensors(q, k_cache, v_cache, table, seq_lens, q_start)
    if window is not None and window < 1:
        _fail(f"window must be None or >= 1, got {window}")
    if page_size < 1 or num_parts < 1:
        _fail(f"page_size and num_parts must be >= 1, got {page_size}, {num_parts}")
    if q.device.type == "cpu":
        _check_values(q, table, seq_lens, q_start, page_size)
    tokens, heads, dim = q.shape
    kv = k_cache.shape[1]
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        _fail(f"out must be like q {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}")
    elif out.stride(-1) != 1:
        _fail("out's last dim must be contiguous")
    if tokens == 0:
        return out
    mod = kernels_for(q.device)
    reqs, group = table.shape[0], heads // kv
    part_shape = (tokens, heads, num_parts)
    m_part = torch.empty(part_shape, dtype=torch.float32, device=q.device)
    l_part = torch.empty(part_shape, dtype=torch.float32, device=q.device)
    o_part = torch.empty((*part_shape, dim), dtype=torch.float32, device=q.device)
    block_d = max(16, 1 << (dim - 1).bit_length())
    opts = launch_config(dim)
    # A size-1 dim's stride is arbitrary; pass the contiguous one so it never picks a variant.
    stride_qt = q.stride(0) if tokens > 1 else heads * q.stride(1)
    grid = (tokens // (BLOCK_M // group) + reqs, kv, num_parts)
    mod.attn_partials[grid](
        q, k_cache, v_cache, table, seq_lens, q_start, m_part, l_part, o_part,
        reqs, num_parts, window or 0, scale * LOG2E,
        stride_qt, q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0),
        v_cache.stride(1), table.stride(0), heads,
        G=group, D=dim, BLOCK_D=block_d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, SPLIT=KV_SPLIT,
        PAGE=page_size, UPCAST=interpreting() and q.dtype != torch.float32,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", **opts,
    )  # fmt: skip
    stride_ot = out.stride(0) if tokens > 1 else heads * out.stride(1)
    block_r = 64 if interpreting() else BLOCK_R
    mod.attn_combine[(math.ceil(tokens * heads / block_r),)](
        m_part, l_part, o_part, out, tokens * heads, num_parts, stride_ot, out.stride(1), heads,
        D=dim, BLOCK_D=block_d, BLOCK_R=block_r, **opts,
    )  # fmt: skip
    return out


def extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    seq_lens: torch.Tensor,
    q_start: torch.Tensor,
    *,
    scale: float,
    window: int | None = None,
    page_size: int = 1,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Prefill / chunked prefill over a ragged batch (any mix of 1..n new tokens per request,
    after any cached prefix): causal inside the new tokens, one part per tile."""
    return paged_attention(
        q, k_cache, v_cache, table, seq_lens, q_start,
        scale=scale, window=window, page_size=page_size, num_parts=1, out=out,
    )  # fmt: skip


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float,
    max_seq_len: int,
    window: int | None = None,
    page_size: int = 1,
    q_start: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One new token per request (q [R, H, D]), split-K over keys: `decode_parts(max_seq_len,
    window)` parts per request, folded by the combine kernel. `q_start` (arange(R + 1)) may be
    passed to reuse a buffer (a captured graph's)."""
    if q_start is None:
        q_start = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return paged_attention(
        q, k_cache, v_cache, table, seq_lens, q_start,
        scale=scale, window=window, page_size=page_size,
        num_parts=decode_parts(max_seq_len, window), out=out,
    )  # fmt: skip

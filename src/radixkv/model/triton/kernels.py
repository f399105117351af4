"""The Triton kernels of paged attention (see the package docstring for the contract).

Two kernels, one arithmetic for every caller:

- `attn_partials`: one program per (tile of query rows, KV head, part). A tile is up to
  BLOCK_M // G new tokens of one request times the G query heads of the KV head (rows are
  (token, group head) pairs, token-major, so K/V are read once per KV head, never repeated).
  Its keys are summed in splits of SPLIT keys and blocks of BLOCK_N keys, both at absolute
  positions (multiples of the constants), each split from a fresh softmax state; finished splits
  are folded into the running (m, den, o) in increasing order by `merge`. Part z of a tile covers
  split s_first + z, its last part every split from there on, so one part covers them all.
- `attn_combine`: per (token, head) row, folds the parts' (m, den, o) in part order with the same
  `merge`, then out = o / den in the output dtype.

A row's state (m, den, o) is its running max score, the sum of exp2(score - m) and the sum of
those weights times the values; m is in log2 units (scores are multiplied by scale * log2(e)
and exponentiated with exp2).
A row's state changes only in blocks where it sees a key and a split or part is folded only when
it saw one, so the blocks a tile covers for its other rows change nothing for this one.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def merge(m, den, o, m_s, den_s, o_s):
    """Fold the state (m_s, den_s, o_s) of later keys into (m, den, o): rows [R], o [R, D]. A
    side whose m is -inf (no key seen) is taken over exactly, never multiplied."""
    m_new = tl.maximum(m, m_s)
    safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    a = tl.exp2(m - safe)
    b = tl.exp2(m_s - safe)
    den_new = den * a + den_s * b
    o_new = o * a[:, None] + o_s * b[:, None]
    keep = m_s == float("-inf")
    take = m == float("-inf")
    m_out = tl.where(keep, m, tl.where(take, m_s, m_new))
    den_out = tl.where(keep, den, tl.where(take, den_s, den_new))
    o_out = tl.where(keep[:, None], o, tl.where(take[:, None], o_s, o_new))
    return m_out, den_out, o_out


@triton.jit
def _find_request(QStart, num_requests, tile, TPT: tl.constexpr):
    """The request of tile `tile`: request r owns tiles [q_start[r] // TPT + r,
    q_start[r + 1] // TPT + r + 1), at least ceil(extend_len / TPT) of them."""
    lo = tile * 0
    hi = num_requests - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        first = tl.load(QStart + mid).to(tl.int32) // TPT + mid
        if first <= tile:
            lo = mid
        else:
            hi = mid - 1
    return lo


@triton.jit
def _split_state(
    q, qpos, kvh, r, lo, p_last, s, window, qk_scale,
    K, V, Table, stride_ks, stride_kh, stride_vs, stride_vh, stride_table,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr, PAGE: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """(m, den, o) of every row of the tile over the keys of split s, from a fresh state."""
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    den = tl.zeros([BLOCK_M], tl.float32)
    o = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    kb_begin = tl.maximum(s * SPLIT, lo // BLOCK_N * BLOCK_N)
    kb_stop = tl.minimum((s + 1) * SPLIT, p_last + 1)
    for kb in range(kb_begin, kb_stop, BLOCK_N):
        kpos = kb + tl.arange(0, BLOCK_N)
        k_ok = (kpos >= lo) & (kpos <= p_last)
        if PAGE == 1:
            slot = tl.load(Table + r * stride_table + kpos, mask=k_ok, other=0).to(tl.int64)
        else:
            page = tl.load(Table + r * stride_table + kpos // PAGE, mask=k_ok, other=0)
            slot = page.to(tl.int64) * PAGE + kpos % PAGE
        kv_mask = k_ok[:, None] & d_ok[None, :]
        k = tl.load(K + slot[:, None] * stride_ks + kvh * stride_kh + d[None, :], mask=kv_mask,
                    other=0.0)  # fmt: skip
        v = tl.load(V + slot[:, None] * stride_vs + kvh * stride_vh + d[None, :], mask=kv_mask,
                    other=0.0)  # fmt: skip
        if UPCAST:  # the interpreter multiplies 16-bit floats as integers
            k = k.to(tl.float32)
        sc = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        vis = (kpos[None, :] <= qpos[:, None]) & k_ok[None, :]
        if window > 0:
            vis = vis & (kpos[None, :] > qpos[:, None] - window)
        sc = tl.where(vis, sc, float("-inf"))
        m_blk = tl.max(sc, 1)
        seen = m_blk > float("-inf")
        m_new = tl.maximum(m, m_blk)
        safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - safe)
        p = tl.exp2(sc - safe[:, None])
        den_new = den * alpha + tl.sum(p, 1)
        pv = p.to(v.dtype)
        if UPCAST:
            pv = pv.to(tl.float32)
            v = v.to(tl.float32)
        o_new = tl.dot(pv, v, o * alpha[:, None], input_precision=DOT_PRECISION)
        m = tl.where(seen, m_new, m)
        den = tl.where(seen, den_new, den)
        o = tl.where(seen[:, None], o_new, o)
    return m, den, o


@triton.jit(
    # One binary for every batch: what varies from call to call is never specialized on (a 1,
    # or a multiple of 16, would otherwise compile another variant). What stays is the dtypes,
    # the constexprs and the model's fixed strides.
    do_not_specialize=["num_requests", "n_parts", "window", "stride_table"],
    do_not_specialize_on_alignment=["Table", "SeqLens", "QStart"],
)
def attn_partials(
    Q, K, V, Table, SeqLens, QStart, MPart, LPart, OPart,
    num_requests, n_parts, window, qk_scale,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_table, H,
    G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, PAGE: tl.constexpr, UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Partials of one (tile, KV head, part); see the module docstring. Parts are [T, H, n_parts]
    (m, den) and [T, H, n_parts, D] (o), float32, contiguous."""
    TPT: tl.constexpr = BLOCK_M // G
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    part = tl.program_id(2)
    r = _find_request(QStart, num_requests, tile, TPT)
    q0 = tl.load(QStart + r).to(tl.int32)
    n_new = tl.load(QStart + r + 1).to(tl.int32) - q0
    prefix = tl.load(SeqLens + r).to(tl.int32) - n_new
    t0 = (tile - (q0 // TPT + r)) * TPT
    n_tok = tl.minimum(n_new - t0, TPT)
    rows = tl.arange(0, BLOCK_M)
    tok = rows // G
    head = kvh * G + rows % G
    row_ok = tok < n_tok
    qpos = prefix + t0 + tok
    p_first = prefix + t0
    p_last = p_first + n_tok - 1
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q_rows = (q0 + t0 + tok).to(tl.int64)
    q = tl.load(Q + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # fmt: skip
    if UPCAST:
        q = q.to(tl.float32)
    lo = p_first * 0
    if window > 0:
        lo = tl.maximum(p_first - window + 1, 0)
    s_first = lo // SPLIT
    s_last = tl.where(n_tok > 0, p_last // SPLIT, s_first - 1)
    s_begin = s_first + part
    s_stop = tl.where(part == n_parts - 1, s_last + 1, tl.minimum(s_begin + 1, s_last + 1))
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    den = tl.zeros([BLOCK_M], tl.float32)
    o = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for s in range(s_begin, s_stop):
        m_s, den_s, o_s = _split_state(
            q, qpos, kvh, r, lo, p_last, s, window, qk_scale,
            K, V, Table, stride_ks, stride_kh, stride_vs, stride_vh, stride_table,
            D, BLOCK_D, BLOCK_M, BLOCK_N, SPLIT, PAGE, UPCAST, DOT_PRECISION,
        )  # fmt: skip
        m, den, o = merge(m, den, o, m_s, den_s, o_s)
    idx = (q_rows * H + head) * n_parts + part
    tl.store(MPart + idx, m, mask=row_ok)
    tl.store(LPart + idx, den, mask=row_ok)
    tl.store(OPart + idx[:, None] * D + d[None, :], o, mask=row_ok[:, None] & d_ok[None, :])


@triton.jit(do_not_specialize=["num_rows", "n_parts"])
def attn_combine(
    MPart, LPart, OPart, Out, num_rows, n_parts, stride_ot, stride_oh, H,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """out[t, h] = the fold of row (t, h)'s parts in part order, o / den, in Out's dtype."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < num_rows
    d = tl.arange(0, BLOCK_D)
    mask = row_ok[:, None] & (d < D)[None, :]
    rows64 = rows.to(tl.int64)
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    den = tl.zeros([BLOCK_R], tl.float32)
    o = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for z in range(0, n_parts):
        idx = rows64 * n_parts + z
        m_s = tl.load(MPart + idx, mask=row_ok, other=float("-inf"))
        den_s = tl.load(LPart + idx, mask=row_ok, other=0.0)
        o_s = tl.load(OPart + idx[:, None] * D + d[None, :], mask=mask, other=0.0)
        m, den, o = merge(m, den, o, m_s, den_s, o_s)
    out = o / tl.where(row_ok, den, 1.0)[:, None]
    tok = rows64 // H
    head = rows64 % H
    dst = Out + tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
    tl.store(dst, out.to(Out.dtype.element_ty), mask=mask)

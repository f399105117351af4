// Attention on AMX tiles for bfloat16 pools (CPUs with amx_bf16). The extend and the decode
// kernels both run it, so the order shared by the two (decode_canon.h: keys in blocks of 64 at
// absolute positions, the same online softmax) holds with tile products in place of VDPBF16PS:
//   - a score is TDPBF16PS over the head dim (attn_amx_tiles.h), then times the scale;
//   - the block's softmax is decode_canon's row_softmax arithmetic;
//   - o = o * alpha, then two TDPBF16PS steps of 32 keys each (the weights rounded to bf16 pairs;
//     keys past the block's last weigh +0 against V rows of +0).
// The bits differ from the VDPBF16PS chain, so a process takes this path for every bf16 call or
// for none (radixkv_amx::enabled() decides once per process).
//
// Rows are query heads (a prefill item: its tokens x the G heads of a KV head; a decode item: the
// G heads of one request), at most 64, each at its own position. Two forms of the same
// arithmetic:
//   - row form (one row tile: a decode item): each row's scores gathered into sc[row][key], the
//     softmax per row (row_softmax itself), o[row][d] += pw[row][key/2] . vb[key/2][d];
//   - lanes form (more rows: a prefill item): the rows in vector lanes, st[key][row], so a
//     block's max and sum are vertical ops over 16 rows at a time, and O^T[d][row] += V^T . P^T.
//     Every element takes the same operations as in the row form: the same scale, mask and exp,
//     decode_canon's pairwise sum order (e[c] + e[c + 32], then + 16, + 8, + 4, + 2, + 1), the
//     same fma for l, alpha multiply and bf16 rounding, and tile products whose elements are the
//     same chains with the roles of A and B swapped.
// So a row's bits do not depend on which form ran it, nor on what else shares its item.
#pragma once

#include "attn_amx_tiles.h"

#if defined(RADIXKV_AMX)
namespace radixkv_attn_amx {

// Starts the loads of the K and V rows of keys [kb0, kb0 + nk) of KV head h.
inline void prefetch_block(const Geometry& g, const BF16* k, const BF16* v, const int64_t* sl,
                           int64_t kb0, int64_t nk, int64_t h) {
  radixkv_simd::prefetch_kv(k, v, sl + kb0, nk, g.k_row, h * g.k_head, g.v_row, h * g.v_head,
                            g.D * static_cast<int64_t>(sizeof(BF16)));
}

// -- row form ------------------------------------------------------------------------------------

// Lanes of keys [first, first + 16) that lie in [lo, hi].
inline __mmask16 visible(int64_t first, int64_t lo, int64_t hi) {
  if (hi < first || lo > first + 15) return 0;
  __mmask16 ok = lanes(hi + 1 - first);
  if (lo > first) ok &= static_cast<__mmask16>(~lanes(lo - first));
  return ok;
}

// Row r after a block's scores: scale and mask (keys outside [max(lo, window start), pos] and
// past nk), the online softmax, o scaled by alpha, the weights as bf16 pairs.
inline void finish_row(const Geometry& g, int64_t r, int64_t kb0, int64_t nk, Scratch& w) {
  const int64_t p = w.pos[r];
  const int64_t lo = g.window > 0 ? std::max<int64_t>(0, p - g.window + 1) : 0;
  const int64_t hi = std::min<int64_t>(p, kb0 + nk - 1);
  const __m512 neg = _mm512_set1_ps(kNegInf), scale = _mm512_set1_ps(g.scale);
  float* s = w.sc[r];
  for (int j = 0; j < 4; ++j) {
    const __mmask16 ok = visible(kb0 + j * 16, lo, hi);
    _mm512_store_ps(s + j * 16,
                    _mm512_mask_mov_ps(neg, ok, _mm512_mul_ps(_mm512_load_ps(s + j * 16), scale)));
  }
  const __m512 alpha = _mm512_set1_ps(radixkv_decode::row_softmax(s, w.m[r], w.l[r]));
  for (int64_t d = 0; d < g.D; d += 16)
    _mm512_store_ps(&w.o[r][d], _mm512_mul_ps(_mm512_load_ps(&w.o[r][d]), alpha));
  for (int j = 0; j < 4; j += 2) {
    // cvtne2ps puts its second operand's 16 weights in the low half: words in key order.
    const __m512i pairs = (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(s + j * 16 + 16),
                                                       _mm512_load_ps(s + j * 16));
    _mm512_store_si512(&w.pw[r][j * 8], pairs);
  }
}

// o[row][d] += pw[row] . vb for row tiles [0, rt_n) and d tiles [0, dt_n), 32 keys per step
// (two steps, in order).
inline void values(int64_t rt_n, int64_t dt_n, Scratch& w) {
  for (int64_t rt = 0; rt < rt_n; rt += 2)
    for (int64_t dt = 0; dt < dt_n; dt += 2) {
      const bool two_r = rt + 1 < rt_n, two_d = dt + 1 < dt_n;
      const int64_t r1 = two_r ? rt * 16 + 16 : rt * 16, d1 = two_d ? dt * 16 + 16 : dt * 16;
      const TileSrc a[2] = {tile_src(&w.pw[rt * 16][0], kKeys * 2, 64),
                            tile_src(&w.pw[r1][0], kKeys * 2, 64)};
      const TileSrc b[2] = {tile_src(&w.vb[0][dt * 16], kMaxD * 4, 16 * kMaxD * 4),
                            tile_src(&w.vb[0][d1], kMaxD * 4, 16 * kMaxD * 4)};
      float* const c[2][2] = {{&w.o[rt * 16][dt * 16], &w.o[rt * 16][d1]},
                              {&w.o[r1][dt * 16], &w.o[r1][d1]}};
      tile_block(a, two_r, b, two_d, kKeys / 32, c, kMaxD * 4, true);
    }
}

// -- lanes form ----------------------------------------------------------------------------------

// V^T as key pairs, vt[d][pair] = (V[2 pair][d], V[2 pair + 1][d]): the pairs along keys of
// load_values (vb[pair][d]), transposed in 16 x 16 word blocks.
inline void load_values_t(const Geometry& g, const BF16* v, const int64_t* sl, int64_t kb0,
                          int64_t nk, int64_t h, int64_t buf, Scratch& w) {
  load_values(g, v, sl, kb0, nk, h, w);
  for (int64_t p0 = 0; p0 < kKeys / 2; p0 += 16)
    for (int64_t d0 = 0; d0 < g.D; d0 += 16) {
      __m512 rows[16];
      for (int i = 0; i < 16; ++i) rows[i] = _mm512_castsi512_ps(_mm512_load_si512(&w.vb[p0 + i][d0]));
      transpose16(rows);
      for (int t = 0; t < 16; ++t)
        _mm512_store_si512(&w.vt[buf][d0 + t][p0], _mm512_castps_si512(rows[t]));
    }
}

// The online softmax of row tile rt over one block, rows in lanes: st[key][row] (raw scores)
// becomes the weights as bf16 pairs pt[pair][row]; m, l and ot's columns are updated.
inline void softmax_t(const Geometry& g, int64_t rt, int64_t kb0, int64_t nk, bool full,
                      Scratch& w) {
  const int64_t r0 = rt * 16;
  const __m512 neg = _mm512_set1_ps(kNegInf), scale = _mm512_set1_ps(g.scale);
  // Positions as 16 int32 lanes (narrowed from the int64 ones in registers: a vector load of
  // lanes just written one by one would wait for those stores); lo: the window's first key.
  const __m512i pv = _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm512_cvtepi64_epi32(_mm512_loadu_si512(&w.pos[r0]))),
      _mm512_cvtepi64_epi32(_mm512_loadu_si512(&w.pos[r0 + 8])), 1);
  const __m512i lv =
      g.window > 0 ? _mm512_max_epi32(_mm512_setzero_si512(),
                                      _mm512_sub_epi32(pv, _mm512_set1_epi32(
                                                               static_cast<int32_t>(g.window - 1))))
                   : _mm512_setzero_si512();
  __m512 e[kKeys];
  __m512 bm = neg;
  for (int64_t c = 0; c < kKeys; ++c) {
    __m512 s = _mm512_mul_ps(_mm512_load_ps(&w.st[c][r0]), scale);
    if (!full) {
      const __m512i j = _mm512_set1_epi32(static_cast<int32_t>(kb0 + c));
      __mmask16 ok = c < nk ? _mm512_cmple_epi32_mask(j, pv) : 0;
      ok &= _mm512_cmpge_epi32_mask(j, lv);
      s = _mm512_mask_mov_ps(neg, ok, s);
    }
    e[c] = s;
    bm = _mm512_max_ps(bm, s);
  }
  const __m512 m_old = _mm512_loadu_ps(&w.m[r0]);
  const __m512 m_new = _mm512_max_ps(m_old, bm);
  // -inf (nothing visible yet) is replaced by 0 so that -inf - m stays -inf, never NaN.
  const __m512 safe =
      _mm512_mask_mov_ps(m_new, _mm512_cmp_ps_mask(m_new, neg, _CMP_EQ_OQ), _mm512_setzero_ps());
  const __m512 alpha = exp_neg(_mm512_sub_ps(m_old, safe));
  for (int64_t c = 0; c < kKeys; ++c) e[c] = exp_neg(_mm512_sub_ps(e[c], safe));
  __m512 t[32];
  for (int c = 0; c < 32; ++c) t[c] = _mm512_add_ps(e[c], e[c + 32]);
  for (int half = 16; half >= 1; half /= 2)
    for (int c = 0; c < half; ++c) t[c] = _mm512_add_ps(t[c], t[c + half]);
  _mm512_storeu_ps(&w.l[r0], _mm512_fmadd_ps(_mm512_loadu_ps(&w.l[r0]), alpha, t[0]));
  _mm512_storeu_ps(&w.m[r0], m_new);
  // o * 1 is o: when no row's max moved (the common case past the first blocks) skip the pass.
  if (_mm512_cmp_ps_mask(alpha, _mm512_set1_ps(1.f), _CMP_NEQ_UQ) != 0)
    for (int64_t d = 0; d < g.D; ++d)
      _mm512_store_ps(&w.ot[d][r0], _mm512_mul_ps(_mm512_load_ps(&w.ot[d][r0]), alpha));
  // cvtne2ps puts its second operand's 16 weights in the low half; interleaving the halves
  // gives each row's word (key 2c, key 2c + 1).
  const __m512i idx = interleave_idx();
  for (int64_t c = 0; c < kKeys / 2; ++c) {
    const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(e[2 * c + 1], e[2 * c]);
    _mm512_store_si512(&w.pt[c][r0], _mm512_permutexvar_epi16(idx, both));
  }
}

// ot[d][row] += vt[d] . pt for d tiles [0, dt_n) and row tiles [0, rt_n), 32 keys per step.
inline void values_t(int64_t rt_n, int64_t dt_n, int64_t buf, Scratch& w) {
  for (int64_t dt = 0; dt < dt_n; dt += 2)
    for (int64_t rt = 0; rt < rt_n; rt += 2) {
      const bool two_d = dt + 1 < dt_n, two_r = rt + 1 < rt_n;
      const int64_t d1 = two_d ? dt * 16 + 16 : dt * 16, r1 = two_r ? rt * 16 + 16 : rt * 16;
      const TileSrc a[2] = {tile_src(&w.vt[buf][dt * 16][0], kKeys / 2 * 4, 64),
                            tile_src(&w.vt[buf][d1][0], kKeys / 2 * 4, 64)};
      const TileSrc b[2] = {tile_src(&w.pt[0][rt * 16], kRows * 4, 16 * kRows * 4),
                            tile_src(&w.pt[0][r1], kRows * 4, 16 * kRows * 4)};
      float* const c[2][2] = {{&w.ot[dt * 16][rt * 16], &w.ot[dt * 16][r1]},
                              {&w.ot[d1][rt * 16], &w.ot[d1][r1]}};
      tile_block(a, two_d, b, two_r, kKeys / 32, c, kRows * 4, true);
    }
}

// attend for more than one row tile, transposed (see above); o[row] is filled from ot at the end.
inline void attend_t(const Geometry& g, const BF16* k, const BF16* v, const int64_t* sl, int64_t h,
                     Scratch& w) {
  const int64_t R = w.rows, rt_n = (R + 15) / 16, dp = (g.D + 31) / 32 * 32;
  // Padding rows (up to the row tile) repeat the last row's position: finite, never stored.
  for (int64_t r = 0; r < rt_n * 16; ++r) {
    if (r >= R) w.pos[r] = w.pos[R - 1];
    w.m[r] = kNegInf;
    w.l[r] = 0.f;
  }
  for (int64_t d = 0; d < g.D; ++d) std::fill(w.ot[d], w.ot[d] + rt_n * 16, 0.f);
  w.queries_t(rt_n * 16, dp);
  const int64_t first = w.pos[0], last = w.pos[R - 1];
  const int64_t lo = g.window > 0 ? std::max<int64_t>(0, first - g.window + 1) : 0;
  // A block's V^T is packed while the block before it is still in flight (between its softmax
  // and its values): a tile load of lines that vector stores have just written waits for them.
  const int64_t kb_first = lo / kKeys * kKeys;
  auto keys_in = [&](int64_t kb0) { return std::min<int64_t>(kKeys, last + 1 - kb0); };
  load_values_t(g, v, sl, kb_first, keys_in(kb_first), h, 0, w);
  for (int64_t kb0 = kb_first, buf = 0; kb0 <= last; kb0 += kKeys, buf ^= 1) {
    const int64_t nk = keys_in(kb0), kt_n = (nk + 15) / 16;
    if (kb0 + kKeys <= last) prefetch_block(g, k, v, sl, kb0 + kKeys, keys_in(kb0 + kKeys), h);
    scores_t(rt_n, kt_n, dp, block_keys(g, k, sl, kb0, nk, h, w), w);
    // Every row sees the whole block unless it reaches past a row's position or the window.
    const bool full = nk == kKeys && kb0 + nk - 1 <= first &&
                      (g.window == 0 || kb0 >= last - g.window + 1);
    for (int64_t rt = 0; rt < rt_n; ++rt) softmax_t(g, rt, kb0, nk, full, w);
    if (kb0 + kKeys <= last)
      load_values_t(g, v, sl, kb0 + kKeys, keys_in(kb0 + kKeys), h, buf ^ 1, w);
    values_t(rt_n, g.D / 16, buf, w);
  }
  // o[row][d] = ot[d][row] (16 x 16 word transposes: a copy, no arithmetic).
  for (int64_t rt = 0; rt < rt_n; ++rt)
    for (int64_t d0 = 0; d0 < g.D; d0 += 16) {
      __m512 rows[16];
      for (int i = 0; i < 16; ++i) rows[i] = _mm512_load_ps(&w.ot[d0 + i][rt * 16]);
      transpose16(rows);
      for (int t = 0; t < 16; ++t) _mm512_store_ps(&w.o[rt * 16 + t][d0], rows[t]);
    }
}

// Rows [0, w.rows) (queries in qr, positions in pos) of KV head h attend to the context whose
// key j sits at slot sl[j]; o and l hold the unnormalised output and the softmax sums after.
// A block's scores take K straight from the pool when the rows fit one row tile and its key tiles
// lie at consecutive slots (see above), else the transposed K: the same bits either way.
// Needs the tile configuration of radixkv_amx::configure() on this thread.
inline void attend(const Geometry& g, const BF16* k, const BF16* v, const int64_t* sl, int64_t h,
                   Scratch& w) {
  const int64_t R = w.rows, rt_n = (R + 15) / 16, dp = (g.D + 31) / 32 * 32;
  if (rt_n > 1) return attend_t(g, k, v, sl, h, w);
  for (int64_t r = 0; r < R; ++r) {
    w.m[r] = kNegInf;
    w.l[r] = 0.f;
    std::fill(w.o[r], w.o[r] + g.D, 0.f);
  }
  w.queries_t(16, dp);
  alignas(64) int32_t step[16];
  for (int i = 0; i < 16; ++i) step[i] = i * static_cast<int32_t>(kRows);
  const __m512i gather = _mm512_load_si512(step);
  const int64_t first = w.pos[0], last = w.pos[R - 1];
  const int64_t lo = g.window > 0 ? std::max<int64_t>(0, first - g.window + 1) : 0;
  for (int64_t kb0 = lo / kKeys * kKeys; kb0 <= last; kb0 += kKeys) {
    const int64_t nk = std::min<int64_t>(kKeys, last + 1 - kb0), kt_n = (nk + 15) / 16;
    if (kb0 + kKeys <= last)  // the next block's rows load while this one computes
      prefetch_block(g, k, v, sl, kb0 + kKeys, std::min<int64_t>(kKeys, last + 1 - kb0 - nk), h);
    load_values(g, v, sl, kb0, nk, h, w);
    scores_t(1, kt_n, dp, block_keys(g, k, sl, kb0, nk, h, w), w);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < kt_n; ++j)  // tiles past kt_n: stale, and finish_row masks them
        _mm512_store_ps(&w.sc[r][j * 16], _mm512_i32gather_ps(gather, &w.st[j * 16][r], 4));
    for (int64_t r = 0; r < R; ++r) finish_row(g, r, kb0, nk, w);
    values(1, g.D / 16, w);
  }
}

// Row r's output, o * (1 / l), rounded once to bf16.
inline void store_row(const Scratch& w, int64_t r, int64_t D, BF16* dst) {
  const float inv = 1.f / w.l[r];
  for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<BF16>(w.o[r][d] * inv);
}

}  // namespace radixkv_attn_amx
#endif

// Attention on AMX tiles for bfloat16 pools (CPUs with amx_bf16). The extend and the decode
// kernels both run it, so the order shared by the two (decode_canon.h: keys in blocks of 64 at
// absolute positions, the same online softmax) holds with tile products in place of VDPBF16PS:
//   - a score is TDPBF16PS over the head dim in steps of 32 (zero past D), starting from 0, then
//     times the scale;
//   - the block's softmax is decode_canon's row_softmax (one function for every caller);
//   - o = o * alpha, then two TDPBF16PS steps of 32 keys each (the weights rounded to bf16 pairs;
//     keys past the block's last weigh +0 against V rows of +0).
// An element of a tile product depends on its own A row, its own B column and its accumulator
// alone, so which rows share a tile (other requests' heads, other tokens of a chunk, padding)
// changes nothing: a row's bits are those of the same row computed alone.
// The bits differ from the VDPBF16PS chain, so a process takes this path for every bf16 call or
// for none (radixkv_amx::enabled() decides once per process).
//
// Rows are query heads (a prefill item: its tokens x the G heads of a KV head; a decode item: the
// G heads of one request), at most 64, each at its own position. Layouts (row-major, keys along
// a row): queries qr[row][d] bf16; K^T as 32-bit words kt[word][key] (the B tile of the scores);
// scores sc[row][key]; weights pw[row][key/2] as bf16 pairs (the A tile of the values); V pairs
// along keys vb[key/2][d] (the B tile); output o[row][d] in f32.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "decode_canon.h"
#include "gemm_amx.h"

#if defined(RADIXKV_AMX)
namespace radixkv_attn_amx {

using radixkv_decode::kBlockKeys;
using radixkv_decode::kNegInf;
using radixkv_simd::interleave_idx;
using radixkv_simd::lanes;

constexpr int64_t kKeys = kBlockKeys;  // 64: two value steps of 32 keys
constexpr int64_t kRows = 64;          // rows per item at most (four row tiles)
constexpr int64_t kMaxD = 256;
using BF16 = c10::BFloat16;

struct Geometry {
  int64_t D, k_row, k_head, v_row, v_head, window;  // strides in elements; window 0: none
  float scale;
};

// One thread's buffers (about 190 KB, allocated once per call and thread, not zeroed: every part
// a live row reads is written first; padding rows only ever reach padding outputs).
struct Scratch {
  alignas(64) uint16_t qr[kRows][kMaxD];
  alignas(64) uint32_t kt[kMaxD / 2][kKeys];
  alignas(64) uint32_t vb[kKeys / 2][kMaxD];
  alignas(64) float sc[kRows][kKeys];
  alignas(64) uint32_t pw[kRows][kKeys / 2];
  alignas(64) float o[kRows][kMaxD];
  // attend_few only: the block's K rows as they are (the A tile of the transposed scores), the
  // queries as words x rows (its B tile), and the transposed scores st[key][row].
  alignas(64) uint16_t kr[kKeys][kMaxD];
  alignas(64) uint32_t qt[kMaxD / 2][kRows];
  alignas(64) float st[kKeys][kRows];
  float m[kRows], l[kRows], alpha[kRows];
  int64_t pos[kRows];  // each row's position (non-decreasing)
  int64_t rows = 0;    // live rows of the current item

  // Head-dim words past D up to a whole step of 32 are +0 in both operands of a score.
  explicit Scratch(int64_t D) {
    const int64_t dp = (D + 31) / 32 * 32;
    for (int64_t i = D / 2; i < dp / 2; ++i) std::fill(kt[i], kt[i] + kKeys, 0u);
    for (auto& row : kr) std::fill(row + D, row + dp, uint16_t{0});
  }

  // Row r's query: D values from src, then +0 up to the step of 32.
  void set_query(int64_t r, const BF16* src, int64_t D) {
    std::memcpy(qr[r], src, D * 2);
    std::fill(qr[r] + D, qr[r] + (D + 31) / 32 * 32, uint16_t{0});
  }
};

// One thread's tile configuration (held while it lives) and scratch.
struct TileThread {
  Scratch w;
  explicit TileThread(int64_t D) : w(D) { radixkv_amx::configure(); }
  ~TileThread() { _tile_release(); }
  TileThread(const TileThread&) = delete;
  TileThread& operator=(const TileThread&) = delete;
};

// Lanes of keys [first, first + 16) that lie in [lo, hi].
inline __mmask16 visible(int64_t first, int64_t lo, int64_t hi) {
  if (hi < first || lo > first + 15) return 0;
  __mmask16 ok = lanes(hi + 1 - first);
  if (lo > first) ok &= static_cast<__mmask16>(~lanes(lo - first));
  return ok;
}

// The block's V rows as pairs along keys into vb (keys past nk are +0).
inline void load_values(const Geometry& g, const BF16* v, const int64_t* sl, int64_t kb0,
                        int64_t nk, int64_t h, Scratch& w) {
  const __m512i idx = interleave_idx();
  for (int64_t cp = 0; cp < kKeys / 2; ++cp) {
    const int64_t c = 2 * cp;
    const BF16* a = c < nk ? v + sl[kb0 + c] * g.v_row + h * g.v_head : nullptr;
    const BF16* b = c + 1 < nk ? v + sl[kb0 + c + 1] * g.v_row + h * g.v_head : nullptr;
    for (int64_t d = 0; d < g.D; d += 16) {
      const __m256i lo = a ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + d))
                           : _mm256_setzero_si256();
      const __m256i hi = b ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + d))
                           : _mm256_setzero_si256();
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      _mm512_store_si512(&w.vb[cp][d], _mm512_permutexvar_epi16(idx, both));
    }
  }
}

// The block's K rows transposed into kt (keys past nk repeat the last, finite and masked) and its
// V rows as pairs (load_values).
inline void load_block(const Geometry& g, const BF16* k, const BF16* v, const int64_t* sl,
                       int64_t kb0, int64_t nk, int64_t h, Scratch& w) {
  const int64_t nw = g.D / 2;
  for (int64_t j = 0; j * 16 < nk; ++j)
    for (int64_t i0 = 0; i0 < nw; i0 += 16) {
      __m512 rows[16];
      for (int c = 0; c < 16; ++c) {
        const int64_t key = kb0 + std::min<int64_t>(j * 16 + c, nk - 1);
        const float* row = reinterpret_cast<const float*>(k + sl[key] * g.k_row + h * g.k_head);
        rows[c] = _mm512_maskz_loadu_ps(lanes(nw - i0), row + i0);
      }
      radixkv_decode::transpose16(rows);
      for (int64_t t = 0; t < 16 && i0 + t < nw; ++t) _mm512_store_ps(&w.kt[i0 + t][j * 16], rows[t]);
    }
  load_values(g, v, sl, kb0, nk, h, w);
}

// Scores sc[row][key] of row tiles [0, rt_n) and key tiles [0, kt_n), over dp head-dim values.
// Tiles 0-3 accumulate 2 row tiles x 2 key tiles; 4, 5 hold queries, 6, 7 K^T.
inline void scores(int64_t rt_n, int64_t kt_n, int64_t dp, Scratch& w) {
  for (int64_t rt = 0; rt < rt_n; rt += 2)
    for (int64_t kt = 0; kt < kt_n; kt += 2) {
      const bool two_r = rt + 1 < rt_n, two_k = kt + 1 < kt_n;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t ds = 0; ds < dp / 32; ++ds) {  // 32 values of the head dim per step, in order
        _tile_loadd(4, &w.qr[rt * 16][ds * 32], kMaxD * 2);
        _tile_loadd(6, &w.kt[ds * 16][kt * 16], kKeys * 4);
        _tile_dpbf16ps(0, 4, 6);
        if (two_k) {
          _tile_loadd(7, &w.kt[ds * 16][kt * 16 + 16], kKeys * 4);
          _tile_dpbf16ps(1, 4, 7);
        }
        if (two_r) {
          _tile_loadd(5, &w.qr[rt * 16 + 16][ds * 32], kMaxD * 2);
          _tile_dpbf16ps(2, 5, 6);
          if (two_k) _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, &w.sc[rt * 16][kt * 16], kKeys * 4);
      if (two_k) _tile_stored(1, &w.sc[rt * 16][kt * 16 + 16], kKeys * 4);
      if (two_r) _tile_stored(2, &w.sc[rt * 16 + 16][kt * 16], kKeys * 4);
      if (two_r && two_k) _tile_stored(3, &w.sc[rt * 16 + 16][kt * 16 + 16], kKeys * 4);
    }
}

// o[row][d] += pw[row] . vb for row tiles [0, rt_n) and d tiles [0, dt_n), 32 keys per step.
inline void values(int64_t rt_n, int64_t dt_n, Scratch& w) {
  for (int64_t rt = 0; rt < rt_n; rt += 2)
    for (int64_t dt = 0; dt < dt_n; dt += 2) {
      const bool two_r = rt + 1 < rt_n, two_d = dt + 1 < dt_n;
      float* o0 = &w.o[rt * 16][dt * 16];
      float* o2 = &w.o[rt * 16 + 16][dt * 16];
      _tile_loadd(0, o0, kMaxD * 4);
      if (two_d) _tile_loadd(1, o0 + 16, kMaxD * 4);
      if (two_r) _tile_loadd(2, o2, kMaxD * 4);
      if (two_r && two_d) _tile_loadd(3, o2 + 16, kMaxD * 4);
      for (int64_t ks = 0; ks < 2; ++ks) {  // keys [32 ks, 32 ks + 32), in order
        _tile_loadd(4, &w.pw[rt * 16][ks * 16], kKeys * 2);
        _tile_loadd(6, &w.vb[ks * 16][dt * 16], kMaxD * 4);
        _tile_dpbf16ps(0, 4, 6);
        if (two_d) {
          _tile_loadd(7, &w.vb[ks * 16][dt * 16 + 16], kMaxD * 4);
          _tile_dpbf16ps(1, 4, 7);
        }
        if (two_r) {
          _tile_loadd(5, &w.pw[rt * 16 + 16][ks * 16], kKeys * 2);
          _tile_dpbf16ps(2, 5, 6);
          if (two_d) _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, o0, kMaxD * 4);
      if (two_d) _tile_stored(1, o0 + 16, kMaxD * 4);
      if (two_r) _tile_stored(2, o2, kMaxD * 4);
      if (two_r && two_d) _tile_stored(3, o2 + 16, kMaxD * 4);
    }
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

// Rows [0, w.rows) (queries in qr, positions in pos) of KV head h attend to the context whose
// key j sits at slot sl[j]; o and l hold the unnormalised output and the softmax sums after.
// Needs the tile configuration of radixkv_amx::configure() on this thread.
inline void attend(const Geometry& g, const BF16* k, const BF16* v, const int64_t* sl, int64_t h,
                   Scratch& w) {
  const int64_t R = w.rows, rt_n = (R + 15) / 16, dp = (g.D + 31) / 32 * 32;
  for (int64_t r = 0; r < R; ++r) {
    w.m[r] = kNegInf;
    w.l[r] = 0.f;
    std::fill(w.o[r], w.o[r] + g.D, 0.f);
  }
  const int64_t first = w.pos[0], last = w.pos[R - 1];
  const int64_t lo = g.window > 0 ? std::max<int64_t>(0, first - g.window + 1) : 0;
  for (int64_t kb0 = lo / kKeys * kKeys; kb0 <= last; kb0 += kKeys) {
    const int64_t nk = std::min<int64_t>(kKeys, last + 1 - kb0);
    load_block(g, k, v, sl, kb0, nk, h, w);
    scores(rt_n, (nk + 15) / 16, dp, w);
    for (int64_t r = 0; r < R; ++r) finish_row(g, r, kb0, nk, w);
    values(rt_n, g.D / 16, w);
  }
}

// attend's arithmetic for a few rows (a decode item: the G heads of one request), without
// transposing K. A score is one TDPBF16PS chain either way: with the roles of the tiles swapped
// (A = 16 keys' rows, B = the queries as words x rows), element [key][row] takes the same bf16
// products (exact in f32) in the same order, so its bits are those of attend's [row][key]. The
// A tiles are read straight from the pool where a key tile's 16 keys sit at consecutive slots
// (a page of 16), else from a copy; each row's 64 scores are gathered back into sc[row], and
// from there on everything is attend's own code. Reading K where it lies is the point: a tile
// load of lines that vector stores have just written (attend's transposed kt) waits for them,
// and for a decode item (3 rows against 64 keys) that wait was most of the block's time; this
// path takes a decode step's attention from 6.5 to 4.8 ms (2 requests x 2,000 keys, 30 layers).

// Where each key tile's 16 K rows are read from: straight from the pool when they sit at 16
// consecutive slots (a page of 16 does), else from kr, where they are copied (keys past nk
// repeating the last).
struct KeySrc {
  const uint16_t* base[kKeys / 16];
  int64_t stride[kKeys / 16];  // bytes
};

inline void load_key_rows(const Geometry& g, const BF16* k, const int64_t* sl, int64_t kb0,
                          int64_t nk, int64_t h, Scratch& w, KeySrc& src) {
  const int64_t n = std::min<int64_t>(kKeys, (nk + 15) / 16 * 16);
  for (int64_t t = 0; t * 16 < n; ++t) {
    const int64_t c0 = t * 16;
    bool run = g.D % 32 == 0 && c0 + 16 <= nk;
    for (int64_t i = 1; run && i < 16; ++i) run = sl[kb0 + c0 + i] == sl[kb0 + c0] + i;
    if (run) {
      src.base[t] = reinterpret_cast<const uint16_t*>(k + sl[kb0 + c0] * g.k_row + h * g.k_head);
      src.stride[t] = g.k_row * 2;
      continue;
    }
    src.base[t] = w.kr[c0];
    src.stride[t] = kMaxD * 2;
    for (int64_t c = c0; c < c0 + 16; ++c) {
      const BF16* from = k + sl[kb0 + std::min<int64_t>(c, nk - 1)] * g.k_row + h * g.k_head;
      for (int64_t d = 0; d < g.D; d += 32) {
        const __mmask32 live = g.D - d >= 32 ? ~__mmask32{0} : (__mmask32{1} << (g.D - d)) - 1;
        _mm512_mask_storeu_epi16(&w.kr[c][d], live, _mm512_maskz_loadu_epi16(live, from + d));
      }
    }
  }
}

// st[key][row] for key tiles [0, kt_n) and row tiles [0, rt_n), over dp head-dim values.
// Tiles 0-3 accumulate 2 key tiles x 2 row tiles; 4, 5 hold K rows, 6, 7 the queries.
inline void scores_t(int64_t rt_n, int64_t kt_n, int64_t dp, const KeySrc& src, Scratch& w) {
  for (int64_t kt = 0; kt < kt_n; kt += 2)
    for (int64_t rt = 0; rt < rt_n; rt += 2) {
      const bool two_k = kt + 1 < kt_n, two_r = rt + 1 < rt_n;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t ds = 0; ds < dp / 32; ++ds) {  // 32 values of the head dim per step, in order
        _tile_loadd(4, src.base[kt] + ds * 32, src.stride[kt]);
        _tile_loadd(6, &w.qt[ds * 16][rt * 16], kRows * 4);
        _tile_dpbf16ps(0, 4, 6);
        if (two_r) {
          _tile_loadd(7, &w.qt[ds * 16][rt * 16 + 16], kRows * 4);
          _tile_dpbf16ps(1, 4, 7);
        }
        if (two_k) {
          _tile_loadd(5, src.base[kt + 1] + ds * 32, src.stride[kt + 1]);
          _tile_dpbf16ps(2, 5, 6);
          if (two_r) _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, &w.st[kt * 16][rt * 16], kRows * 4);
      if (two_r) _tile_stored(1, &w.st[kt * 16][rt * 16 + 16], kRows * 4);
      if (two_k) _tile_stored(2, &w.st[kt * 16 + 16][rt * 16], kRows * 4);
      if (two_k && two_r) _tile_stored(3, &w.st[kt * 16 + 16][rt * 16 + 16], kRows * 4);
    }
}

// Rows [0, w.rows) of KV head h attend to the context at slots sl: attend's results, bit for bit.
inline void attend_few(const Geometry& g, const BF16* k, const BF16* v, const int64_t* sl,
                       int64_t h, Scratch& w) {
  const int64_t R = w.rows, rt_n = (R + 15) / 16, dp = (g.D + 31) / 32 * 32;
  for (int64_t r = 0; r < R; ++r) {
    w.m[r] = kNegInf;
    w.l[r] = 0.f;
    std::fill(w.o[r], w.o[r] + g.D, 0.f);
  }
  // qt[word][row]: word i of row r's query (+0 past D and for rows past R, up to the row tile).
  for (int64_t i = 0; i < dp / 2; ++i)
    for (int64_t r = 0; r < rt_n * 16; ++r) {
      uint32_t word = 0;
      if (r < R) std::memcpy(&word, &w.qr[r][2 * i], 4);
      w.qt[i][r] = word;
    }
  alignas(64) int32_t step[16];
  for (int i = 0; i < 16; ++i) step[i] = i * static_cast<int32_t>(kRows);
  const __m512i gather = _mm512_load_si512(step);
  const int64_t first = w.pos[0], last = w.pos[R - 1];
  const int64_t lo = g.window > 0 ? std::max<int64_t>(0, first - g.window + 1) : 0;
  for (int64_t kb0 = lo / kKeys * kKeys; kb0 <= last; kb0 += kKeys) {
    const int64_t nk = std::min<int64_t>(kKeys, last + 1 - kb0), kt_n = (nk + 15) / 16;
    KeySrc src;
    load_key_rows(g, k, sl, kb0, nk, h, w, src);
    load_values(g, v, sl, kb0, nk, h, w);
    scores_t(rt_n, kt_n, dp, src, w);
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t j = 0; j < kt_n; ++j)  // tiles past kt_n: stale, and finish_row masks them
        _mm512_store_ps(&w.sc[r][j * 16], _mm512_i32gather_ps(gather, &w.st[j * 16][r], 4));
      finish_row(g, r, kb0, nk, w);
    }
    values(rt_n, g.D / 16, w);
  }
}

// Row r's output, o * (1 / l), rounded once to bf16.
inline void store_row(const Scratch& w, int64_t r, int64_t D, BF16* dst) {
  const float inv = 1.f / w.l[r];
  for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<BF16>(w.o[r][d] * inv);
}

}  // namespace radixkv_attn_amx
#endif

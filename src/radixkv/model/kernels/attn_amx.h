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

// One thread's buffers (about 240 KB, allocated once per call and thread, not zeroed: every part
// a live row reads is written first; padding rows only ever reach padding outputs).
struct Scratch {
  alignas(64) uint16_t qr[kRows][kMaxD];
  alignas(64) uint32_t kt[kMaxD / 2][kKeys];
  alignas(64) uint32_t vb[kKeys / 2][kMaxD];
  alignas(64) float sc[kRows][kKeys];
  alignas(64) uint32_t pw[kRows][kKeys / 2];
  alignas(64) float o[kRows][kMaxD];
  // One row tile only (attend): the queries as words x rows (the B tile of the transposed
  // scores) and the transposed scores st[key][row].
  alignas(64) uint32_t qt[kMaxD / 2][kRows];
  alignas(64) float st[kKeys][kRows];
  float m[kRows], l[kRows], alpha[kRows];
  int64_t pos[kRows];  // each row's position (non-decreasing)
  int64_t rows = 0;    // live rows of the current item

  // Head-dim words past D up to a whole step of 32 are +0 in both operands of a score.
  explicit Scratch(int64_t D) {
    const int64_t dp = (D + 31) / 32 * 32;
    for (int64_t i = D / 2; i < dp / 2; ++i) std::fill(kt[i], kt[i] + kKeys, 0u);
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

// The block's K rows transposed into kt (keys past nk repeat the last, finite and masked).
inline void load_keys_t(const Geometry& g, const BF16* k, const int64_t* sl, int64_t kb0,
                        int64_t nk, int64_t h, Scratch& w) {
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
}

// One operand of a tile product: step s's 16 rows start at base + s * step (bytes), `stride`
// bytes apart.
struct TileSrc {
  const uint8_t* base;
  int64_t stride, step;
  const void* at(int64_t s) const { return base + s * step; }
};

inline TileSrc tile_src(const void* base, int64_t stride, int64_t step) {
  return {static_cast<const uint8_t*>(base), stride, step};
}

// A block of up to 2 x 2 f32 tiles: c[i][j] (rows `ldc` bytes apart) = (its old value when
// `accumulate`, else 0) + the sum over `steps` steps of A_i . B_j, for i < 1 + two_a and
// j < 1 + two_b. Tiles 0-3 hold C[i][j] in tile 2i + j, 4-5 the A operands, 6-7 the B ones.
// Each element is one chain over the steps in order, whatever else shares its tiles.
inline void tile_block(const TileSrc (&a)[2], bool two_a, const TileSrc (&b)[2], bool two_b,
                       int64_t steps, float* const (&c)[2][2], int64_t ldc, bool accumulate) {
  if (accumulate) {
    _tile_loadd(0, c[0][0], ldc);
    if (two_b) _tile_loadd(1, c[0][1], ldc);
    if (two_a) _tile_loadd(2, c[1][0], ldc);
    if (two_a && two_b) _tile_loadd(3, c[1][1], ldc);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(4, a[0].at(s), a[0].stride);
    _tile_loadd(6, b[0].at(s), b[0].stride);
    _tile_dpbf16ps(0, 4, 6);
    if (two_b) {
      _tile_loadd(7, b[1].at(s), b[1].stride);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (two_a) {
      _tile_loadd(5, a[1].at(s), a[1].stride);
      _tile_dpbf16ps(2, 5, 6);
      if (two_b) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c[0][0], ldc);
  if (two_b) _tile_stored(1, c[0][1], ldc);
  if (two_a) _tile_stored(2, c[1][0], ldc);
  if (two_a && two_b) _tile_stored(3, c[1][1], ldc);
}

// Scores sc[row][key] of row tiles [0, rt_n) and key tiles [0, kt_n), over dp head-dim values
// (32 per step, in order): queries x K^T.
inline void scores(int64_t rt_n, int64_t kt_n, int64_t dp, Scratch& w) {
  for (int64_t rt = 0; rt < rt_n; rt += 2)
    for (int64_t kt = 0; kt < kt_n; kt += 2) {
      const bool two_r = rt + 1 < rt_n, two_k = kt + 1 < kt_n;
      const int64_t r1 = two_r ? rt * 16 + 16 : rt * 16, k1 = two_k ? kt * 16 + 16 : kt * 16;
      const TileSrc a[2] = {tile_src(&w.qr[rt * 16][0], kMaxD * 2, 64),
                            tile_src(&w.qr[r1][0], kMaxD * 2, 64)};
      const TileSrc b[2] = {tile_src(&w.kt[0][kt * 16], kKeys * 4, 16 * kKeys * 4),
                            tile_src(&w.kt[0][k1], kKeys * 4, 16 * kKeys * 4)};
      float* const c[2][2] = {{&w.sc[rt * 16][kt * 16], &w.sc[rt * 16][k1]},
                              {&w.sc[r1][kt * 16], &w.sc[r1][k1]}};
      tile_block(a, two_r, b, two_k, dp / 32, c, kKeys * 4, false);
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

// The scores of a few rows (at most one row tile: a decode item, the G heads of one request)
// need not transpose K. A score is one TDPBF16PS chain either way: with the roles of the tiles
// swapped (A = 16 keys' rows, B = the queries as words x rows), element [key][row] takes the same
// bf16 products (exact in f32) in the same order, so its bits are those of [row][key]. The A
// tiles are read straight from the pool, for blocks whose key tiles are each 16 keys at
// consecutive slots (a page of 16), and each row's 64 scores are gathered back into sc[row].
// Reading K where it lies is the point: a tile load of lines that vector stores have just written
// (the transposed kt) waits for them, and for a decode item (3 rows against 64 keys) that wait
// was most of the block's time; this takes a decode step's attention from 6.5 to 4.8 ms (2
// requests x 2,000 keys, 30 layers).

// Where each key tile's 16 K rows lie in the pool, when every tile of the block is 16 keys at
// consecutive slots (a page of 16 gives that; a head dim of whole steps of 32 too, so a tile
// row never reads past the head): `in_pool` says so, else the block takes attend's transposed K.
struct KeySrc {
  const uint16_t* base[kKeys / 16];
  int64_t stride = 0;  // bytes
  bool in_pool = false;
};

inline KeySrc key_tiles(const Geometry& g, const BF16* k, const int64_t* sl, int64_t kb0,
                        int64_t nk, int64_t h) {
  KeySrc src;
  if (g.D % 32 || nk % 16) return src;
  for (int64_t t = 0; t * 16 < nk; ++t) {
    const int64_t* run = sl + kb0 + t * 16;
    for (int64_t i = 1; i < 16; ++i)
      if (run[i] != run[0] + i) return src;
    src.base[t] = reinterpret_cast<const uint16_t*>(k + run[0] * g.k_row + h * g.k_head);
  }
  src.stride = g.k_row * 2;
  src.in_pool = true;
  return src;
}

// st[key][row] for key tiles [0, kt_n) and row tiles [0, rt_n), over dp head-dim values: K rows
// x the queries transposed.
inline void scores_t(int64_t rt_n, int64_t kt_n, int64_t dp, const KeySrc& src, Scratch& w) {
  for (int64_t kt = 0; kt < kt_n; kt += 2)
    for (int64_t rt = 0; rt < rt_n; rt += 2) {
      const bool two_k = kt + 1 < kt_n, two_r = rt + 1 < rt_n;
      const int64_t k1 = two_k ? kt + 1 : kt, r1 = two_r ? rt * 16 + 16 : rt * 16;
      const TileSrc a[2] = {tile_src(src.base[kt], src.stride, 64),
                            tile_src(src.base[k1], src.stride, 64)};
      const TileSrc b[2] = {tile_src(&w.qt[0][rt * 16], kRows * 4, 16 * kRows * 4),
                            tile_src(&w.qt[0][r1], kRows * 4, 16 * kRows * 4)};
      float* const c[2][2] = {{&w.st[kt * 16][rt * 16], &w.st[kt * 16][r1]},
                              {&w.st[k1 * 16][rt * 16], &w.st[k1 * 16][r1]}};
      tile_block(a, two_k, b, two_r, dp / 32, c, kRows * 4, false);
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
  const bool few = rt_n == 1;
  for (int64_t r = 0; r < R; ++r) {
    w.m[r] = kNegInf;
    w.l[r] = 0.f;
    std::fill(w.o[r], w.o[r] + g.D, 0.f);
  }
  // qt[word][row]: word i of row r's query (+0 past D and for rows past R, up to the row tile).
  for (int64_t i = 0; few && i < dp / 2; ++i)
    for (int64_t r = 0; r < 16; ++r) {
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
    const KeySrc src = few ? key_tiles(g, k, sl, kb0, nk, h) : KeySrc{};
    load_values(g, v, sl, kb0, nk, h, w);
    if (src.in_pool) {
      scores_t(rt_n, kt_n, dp, src, w);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t j = 0; j < kt_n; ++j)  // tiles past kt_n: stale, and finish_row masks them
          _mm512_store_ps(&w.sc[r][j * 16], _mm512_i32gather_ps(gather, &w.st[j * 16][r], 4));
    } else {  // many rows, scattered slots, a partial last block: K^T
      load_keys_t(g, k, sl, kb0, nk, h, w);
      scores(rt_n, kt_n, dp, w);
    }
    for (int64_t r = 0; r < R; ++r) finish_row(g, r, kb0, nk, w);
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

// The operands and tile products of the AMX attention (attn_amx.h), for bfloat16 pools on CPUs
// with amx_bf16: one thread's scratch and tile configuration, a 2 x 2 tile product, a block's
// scores S^T = K rows x Q^T, and where a block's K and V come from.
//
// A score is TDPBF16PS over the head dim in steps of 32 (zero past D), starting from 0. An
// element of a tile product depends on its own A row, its own B column and its accumulator
// alone, so which rows share a tile (other requests' heads, other tokens of a chunk, padding)
// changes nothing; and with the roles of A and B swapped, element [j][i] takes the same bf16
// products (exact in f32) in the same order as [i][j] did, so its bits are the same. The scores
// are computed as S^T (A = 16 keys' K rows, B = the queries as words x rows) so that K is read
// where it lies: straight from the pool when a key tile is 16 consecutive slots (a page of 16),
// else from a gathered copy, never from a transposed one (a tile load of lines that vector
// stores have just written waits for them; for a decode item that wait was most of its time).
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
using radixkv_simd::exp_neg;
using radixkv_simd::lanes;
using radixkv_simd::transpose16;

constexpr int64_t kKeys = kBlockKeys;  // 64: two value steps of 32 keys
constexpr int64_t kRows = 64;          // rows per item at most (four row tiles)
constexpr int64_t kMaxD = 256;
using BF16 = c10::BFloat16;
struct Geometry {
  int64_t D, k_row, k_head, v_row, v_head, window;  // strides in elements; window 0: none
  float scale;
};

// One thread's buffers (about 380 KB, allocated once per call and thread, not zeroed: every part
// a live row reads is written first; padding rows only ever reach padding outputs). Layouts
// (row-major): queries qr[row][d] bf16 and as words x rows qt[word][row] (the B tile of S^T); the
// block's scores st[key][row]; its gathered K rows kr[key][d]; V as pairs along keys vb[pair][d].
// The row form adds sc[row][key], the weights as pairs pw[row][pair] and o[row][d] (f32); the
// lanes form V^T as pairs vt[d][pair] (two blocks' worth), P^T pt[pair][row] and O^T ot[d][row].
struct Scratch {
  alignas(64) uint16_t qr[kRows][kMaxD];
  alignas(64) uint32_t qt[kMaxD / 2][kRows];
  alignas(64) float st[kKeys][kRows];
  alignas(64) uint16_t kr[kKeys][kMaxD];
  alignas(64) uint32_t vb[kKeys / 2][kMaxD];
  alignas(64) float sc[kRows][kKeys];
  alignas(64) uint32_t pw[kRows][kKeys / 2];
  alignas(64) float o[kRows][kMaxD];
  alignas(64) uint32_t vt[2][kMaxD][kKeys / 2];  // this block's and the next one's
  alignas(64) uint32_t pt[kKeys / 2][kRows];
  alignas(64) float ot[kMaxD][kRows];
  float m[kRows], l[kRows];
  int64_t pos[kRows];  // each row's position (non-decreasing)
  int64_t rows = 0;    // live rows of the current item

  // qt[word][row] for rows [0, cols): word i of row r's query (+0 past D, and for rows past the
  // live ones, up to whole row tiles); dp: the head dim padded to the step of 32.
  void queries_t(int64_t cols, int64_t dp) {
    for (int64_t i = 0; i < dp / 2; ++i)
      for (int64_t r = 0; r < cols; ++r) {
        uint32_t word = 0;
        if (r < rows) std::memcpy(&word, &qr[r][2 * i], 4);
        qt[i][r] = word;
      }
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
  TileThread() { radixkv_amx::configure(); }
  ~TileThread() { _tile_release(); }
  TileThread(const TileThread&) = delete;
  TileThread& operator=(const TileThread&) = delete;
};

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

// Where each key tile's 16 K rows lie in the pool, when every tile of the block is 16 keys at
// consecutive slots (a page of 16 gives that; a head dim of whole steps of 32 too, so a tile
// row never reads past the head): `in_pool` says so, else the block takes the gathered copy.
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

// The block's K rows, gathered into kr[key] (+0 past D up to the step of 32, and for keys past nk).
inline void gather_keys(const Geometry& g, const BF16* k, const int64_t* sl, int64_t kb0,
                        int64_t nk, int64_t h, Scratch& w) {
  const int64_t dp = (g.D + 31) / 32 * 32;
  for (int64_t c = 0; c < (nk + 15) / 16 * 16; ++c) {
    const BF16* src = c < nk ? k + sl[kb0 + c] * g.k_row + h * g.k_head : nullptr;
    for (int64_t d = 0; d < dp; d += 32) {  // 32 values a vector; masked past D (+0)
      const __mmask32 live = src ? _cvtu32_mask32(d + 32 <= g.D ? ~0u : (1u << (g.D - d)) - 1) : 0;
      _mm512_store_si512(&w.kr[c][d], _mm512_maskz_loadu_epi16(live, src ? src + d : nullptr));
    }
  }
}

// Where the block's key tiles are read from: the pool itself when they lie there as whole
// tiles (key_tiles), else the gathered copy in kr.
inline KeySrc block_keys(const Geometry& g, const BF16* k, const int64_t* sl, int64_t kb0,
                         int64_t nk, int64_t h, Scratch& w) {
  KeySrc src = key_tiles(g, k, sl, kb0, nk, h);
  if (!src.in_pool) {
    gather_keys(g, k, sl, kb0, nk, h, w);
    for (int64_t t = 0; t * 16 < nk; ++t) src.base[t] = w.kr[t * 16];
    src.stride = kMaxD * 2;
  }
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

}  // namespace radixkv_attn_amx
#endif

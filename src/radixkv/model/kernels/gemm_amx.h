// The bfloat16 GEMM on AMX tiles (CPUs with amx_bf16), free of torch; gemm.cpp binds it.
//
// Invariance: TDPBF16PS computes each row of its output tile from that row of A alone, and this
// kernel runs the same instructions in the same K order for every row whatever M is (a product's
// rows are taken 16 at a time; the last tile is padded with zero rows that are never stored), so
// a request's row is bit-identical whatever else shares its batch, decode steps and prefill
// chunks alike. Per output: f32 tile accumulators over K in blocks of 32 (in increasing order),
// then + bias, then one rounding to bfloat16 (nearest even). Which weights run here is decided
// once per weight (K a multiple of 32), never per call.
//
// The packed weight is the AVX-512 kernel's bfloat16 layout, [N/16, K/2, 16, 2]: for one block of
// 16 outputs, row r holds the pairs (2r, 2r + 1) of its 16 outputs, which is the VNNI layout a
// B tile wants (16 rows of 64 bytes = 32 values of K for 16 outputs).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define RADIXKV_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>

#include "act.h"
#include <unistd.h>

namespace radixkv_amx {

// Linux lets a process use the AMX tile data only after asking (arch_prctl); once per process.
// RADIXKV_AMX=0 keeps a process off the tiles (the GEMM and attention alike: the AVX-512 BF16
// kernels, other bits), e.g. to test those kernels on an AMX host.
inline bool enabled() {
  static const bool ok = [] {
    const char* env = std::getenv("RADIXKV_AMX");
    if (env != nullptr && env[0] == '0') return false;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: C (16 x 16 f32) for 2 row tiles x 2 output blocks; 4, 5: A (16 rows x 32 bf16);
// 6, 7: B (16 pair rows x 16 outputs).
inline void configure() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  _tile_loadconfig(&c);
}

// f32 tile rows -> + bias -> bf16 (nearest even) into out rows [0, rows), 16 outputs at col.
inline void store_rows(const float* acc, int64_t rows, const float* bias, int64_t col, int64_t n,
                       uint16_t* out, int64_t ldo) {
  const int64_t live = n - col < 16 ? n - col : 16;
  if (live <= 0) return;
  const __mmask16 mask = live == 16 ? 0xFFFF : static_cast<__mmask16>((1u << live) - 1);
  const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + col) : _mm512_setzero_ps();
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 v = _mm512_add_ps(_mm512_loadu_ps(acc + r * 16), b);
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
    _mm256_mask_storeu_epi16(out + r * ldo + col, mask, h);
  }
}

// Rows [m0, m0 + 32) (or 16) of x (bf16, padded to whole tiles, ldx values apart) times output
// blocks j and j + 1 (or j alone) of the packed W (k_pairs rows of 16 words each).
template <bool kTwoRows, bool kTwoBlocks>
inline void tile_pair(const uint16_t* x, int64_t ldx, const uint32_t* w, int64_t k_pairs,
                      int64_t j, float* acc) {
  _tile_zero(0);
  if (kTwoBlocks) _tile_zero(1);
  if (kTwoRows) _tile_zero(2);
  if (kTwoRows && kTwoBlocks) _tile_zero(3);
  const uint32_t* w0 = w + j * k_pairs * 16;
  const uint32_t* w1 = w0 + k_pairs * 16;
  for (int64_t kp = 0; kp < k_pairs; kp += 16) {  // 32 values of K per step, in order
    _tile_loadd(4, x + kp * 2, ldx * 2);
    if (kTwoRows) _tile_loadd(5, x + 16 * ldx + kp * 2, ldx * 2);
    _tile_loadd(6, w0 + kp * 16, 64);
    if (kTwoBlocks) _tile_loadd(7, w1 + kp * 16, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (kTwoBlocks) _tile_dpbf16ps(1, 4, 7);
    if (kTwoRows) _tile_dpbf16ps(2, 5, 6);
    if (kTwoRows && kTwoBlocks) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, acc, 64);
  if (kTwoBlocks) _tile_stored(1, acc + 256, 64);
  if (kTwoRows) _tile_stored(2, acc + 512, 64);
  if (kTwoRows && kTwoBlocks) _tile_stored(3, acc + 768, 64);
}

// The fused gate/up epilogue: gate rows (block j) and up rows (block j + 1) as the plain product
// would store them (+ bias, rounded to bf16), then silu_mul's arithmetic (act.h) on those bf16
// values, into 16 outputs at col of rows [0, rows).
inline void store_silu_rows(const float* gate, const float* up, int64_t rows, const float* bias,
                            int64_t j, int64_t col, uint16_t* out, int64_t ldo) {
  const __m512 bg = bias ? _mm512_loadu_ps(bias + j * 16) : _mm512_setzero_ps();
  const __m512 bu = bias ? _mm512_loadu_ps(bias + j * 16 + 16) : _mm512_setzero_ps();
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 g = _mm512_add_ps(_mm512_loadu_ps(gate + r * 16), bg);
    const __m512 u = _mm512_add_ps(_mm512_loadu_ps(up + r * 16), bu);
    const __m512 gb = radixkv_act::widen_bf16((__m256i)_mm512_cvtneps_pbh(g));
    const __m512 ub = radixkv_act::widen_bf16((__m256i)_mm512_cvtneps_pbh(u));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * ldo + col),
                        radixkv_act::silu_mul_bf16(gb, ub));
  }
}

// Rows [r, r + 32) (or 16) of x times output blocks j and j + 1 (or j alone), stored; with
// `silu`, blocks j and j + 1 are a gate block and its up block and one block of silu(gate) * up
// is stored at column j * 8 of out (n / 2 columns).
inline void row_step(const uint16_t* xr, int64_t k, const uint32_t* w, int64_t k_pairs, int64_t j,
                     int64_t blocks, int64_t r, int64_t m, int64_t mp, const float* bias, int64_t n,
                     uint16_t* out, float* acc, bool silu) {
  const bool two_blocks = j + 1 < blocks, two_rows = r + 16 < mp;
  if (two_rows && two_blocks) tile_pair<true, true>(xr, k, w, k_pairs, j, acc);
  else if (two_rows) tile_pair<true, false>(xr, k, w, k_pairs, j, acc);
  else if (two_blocks) tile_pair<false, true>(xr, k, w, k_pairs, j, acc);
  else tile_pair<false, false>(xr, k, w, k_pairs, j, acc);
  const int64_t rows0 = m - r < 16 ? m - r : 16;
  const int64_t rows1 = two_rows && m > r + 16 ? std::min<int64_t>(16, m - r - 16) : 0;
  if (silu) {
    const int64_t half = n / 2;
    store_silu_rows(acc, acc + 256, rows0, bias, j, j * 8, out + r * half, half);
    if (rows1)
      store_silu_rows(acc + 512, acc + 768, rows1, bias, j, j * 8, out + (r + 16) * half, half);
    return;
  }
  store_rows(acc, rows0, bias, j * 16, n, out + r * n, n);
  if (two_blocks) store_rows(acc + 256, rows0, bias, (j + 1) * 16, n, out + r * n, n);
  if (rows1) {
    store_rows(acc + 512, rows1, bias, j * 16, n, out + (r + 16) * n, n);
    if (two_blocks) store_rows(acc + 768, rows1, bias, (j + 1) * 16, n, out + (r + 16) * n, n);
  }
}

// out[m, n] (bf16) = x[m, k] (bf16) W^T + bias, for k % 32 == 0, with W packed as above.
// `pfor(begin, end, grain, fn)` runs fn(b, e) over ranges of work units (one thread each);
// `threads` is how many it has. With `silu` (n a multiple of 32, W's blocks interleaved as
// gate block, up block, ...: the bias likewise) out gets silu(gate) * up, n / 2 columns.
//
// Cache blocking (it decides only which tiles run when, never a sum's order): the rows are cut
// into panels of about 256 KB of x and the output block pairs into groups of up to 8 (256
// outputs); a unit is one (group, panel), units ordered group-major, so a thread's run of units
// keeps its group's weights in L2 while the x panels pass, and each panel is read from memory
// once per group instead of once per block pair (at 2,048 rows x was read 96 times by the
// gate/up product, and the kernel ran at half of oneDNN's speed).
template <typename PFor>
void gemm(const uint16_t* x, int64_t m, int64_t k, const uint32_t* w, int64_t n,
          const float* bias, uint16_t* out, const PFor& pfor, int64_t threads, bool silu = false) {
  const int64_t mp = (m + 15) / 16 * 16, k_pairs = k / 2, blocks = (n + 15) / 16;
  const int64_t pairs = (blocks + 1) / 2;
  const int64_t panel_rows = std::max<int64_t>(32, (256 * 1024) / (k * 2) / 32 * 32);
  const int64_t panels = (mp + panel_rows - 1) / panel_rows;
  // One panel (x fits in L2 anyway): a unit per pair, as many units as possible to share.
  const int64_t group =
      panels == 1 ? 1 : std::max<int64_t>(1, std::min<int64_t>(8, pairs / (2 * threads)));
  const int64_t groups = (pairs + group - 1) / group;
  // The last 32-row step, when it runs past m, reads a zero-padded copy of its rows instead.
  const int64_t tail_r = (m - 1) / 32 * 32;
  const bool ragged = tail_r + 32 > m && mp > m;
  uint16_t* tail = nullptr;
  if (ragged) {
    tail = static_cast<uint16_t*>(aligned_alloc(64, 32 * k * 2));
    std::memcpy(tail, x + tail_r * k, (m - tail_r) * k * 2);
    std::memset(tail + (m - tail_r) * k, 0, (32 - (m - tail_r)) * k * 2);
  }
  pfor(0, groups * panels, 1, [&](int64_t u0, int64_t u1) {
    configure();
    alignas(64) float acc[4 * 256];
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t g = u / panels, p = u % panels;
      const int64_t r0 = p * panel_rows, r1 = std::min(mp, r0 + panel_rows);
      for (int64_t pair = g * group; pair < std::min(pairs, (g + 1) * group); ++pair)
        for (int64_t r = r0; r < r1; r += 32) {
          const uint16_t* xr = ragged && r == tail_r ? tail : x + r * k;
          row_step(xr, k, w, k_pairs, 2 * pair, blocks, r, m, mp, bias, n, out, acc, silu);
        }
    }
    _tile_release();
  });
  free(tail);
}

}  // namespace radixkv_amx
#endif

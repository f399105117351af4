// The extend kernel's products in float32 FMAs (any K/V dtype, widened to f32 on load): Q^T is
// pre-scaled, a block of keys is copied into contiguous f32 rows, and both products broadcast
// single K / V elements against 16 rows (4 keys or 4 dims x RV row vectors in registers).
#pragma once

#include <type_traits>

#include "extend_common.h"

#if defined(RADIXKV_AVX512)
namespace radixkv_extend {

struct F32Products {
  // Q^T [D][kRows] (times the softmax scale) of the item's rows, 16 rows x 16 dims at a time
  // through an in-register transpose (rows past `rows` are +0).
  template <typename T>
  static void load_q(const Problem& P, const T* q, const Item& it, int64_t rows, Scratch& w) {
    const int64_t G = P.G, D = P.D;
    float* qt = w.qt;
    const __m512 scale = _mm512_set1_ps(P.scale);
    for (int64_t r0 = 0; r0 < kRows; r0 += 16) {
      if (r0 >= rows) {
        for (int64_t d = 0; d < D; ++d) _mm512_storeu_ps(qt + d * kRows + r0, _mm512_setzero_ps());
        continue;
      }
      const T* src[16];
      for (int i = 0; i < 16; ++i) {
        const int64_t ri = std::min<int64_t>(r0 + i, rows - 1);
        src[i] = q + (P.q_start[it.r] + it.t0 + ri / G) * P.q_row + (it.h * G + ri % G) * D;
      }
      const __mmask16 live = lanes(rows - r0);
      for (int64_t d0 = 0; d0 < D; d0 += 16) {
        __m512 x[16];
        for (int i = 0; i < 16; ++i) x[i] = load16(src[i] + d0);
        transpose16(x);  // x[t]: dim d0 + t of the 16 rows
        for (int t = 0; t < 16; ++t)
          _mm512_storeu_ps(qt + (d0 + t) * kRows + r0,
                           _mm512_maskz_mul_ps(live, x[t], scale));
      }
    }
  }

  // Keys [kb0, kb0 + nk) of the context `sl`, KV head h, as f32 rows w.krow / w.vrow: a float32
  // pool's rows are read where they are; other dtypes are widened into kb / vb first.
  template <typename T>
  static void load_keys(const Problem& P, const T* k, const T* v, const int64_t* sl, int64_t kb0,
                        int64_t nk, int64_t h, Scratch& w) {
    const int64_t D = P.D;
    for (int64_t c = 0; c < nk; ++c) {
      const T* kr = k + sl[kb0 + c] * P.k_row + h * P.k_head;
      const T* vr = v + sl[kb0 + c] * P.v_row + h * P.v_head;
      if constexpr (std::is_same_v<T, float>) {
        w.krow[c] = kr;
        w.vrow[c] = vr;
      } else {
        float* kb = w.kb.data() + c * D;
        float* vb = w.vb.data() + c * D;
        for (int64_t d = 0; d < D; d += 16) {
          _mm512_storeu_ps(kb + d, load16(kr + d));
          _mm512_storeu_ps(vb + d, load16(vr + d));
        }
        w.krow[c] = kb;
        w.vrow[c] = vb;
      }
    }
  }

  // S^T[c][rows] = sum_d K[c][d] Q^T[d][rows] for keys [0, nk).
  template <int RV>
  static void scores_wide(const Problem& P, int64_t nk, Scratch& w) {
    const int64_t D = P.D;
    const float* qt = w.qt;
    float* st = w.st.data();
    int64_t c = 0;
    for (; c + 4 <= nk; c += 4) {
      __m512 acc[4][RV];
      for (int i = 0; i < 4; ++i)
        for (int v = 0; v < RV; ++v) acc[i][v] = _mm512_setzero_ps();
      for (int64_t d = 0; d < D; ++d) {
        __m512 q[RV];
        for (int v = 0; v < RV; ++v) {
          q[v] = _mm512_loadu_ps(qt + d * kRows + v * 16);
          keep(q[v]);
        }
        for (int i = 0; i < 4; ++i) {
          const __m512 kv = _mm512_set1_ps(w.krow[c + i][d]);
          for (int v = 0; v < RV; ++v) acc[i][v] = _mm512_fmadd_ps(kv, q[v], acc[i][v]);
        }
      }
      for (int i = 0; i < 4; ++i)
        for (int v = 0; v < RV; ++v) _mm512_storeu_ps(st + (c + i) * kRows + v * 16, acc[i][v]);
    }
    for (; c < nk; ++c) {
      __m512 acc[RV];
      for (int v = 0; v < RV; ++v) acc[v] = _mm512_setzero_ps();
      for (int64_t d = 0; d < D; ++d) {
        const __m512 kv = _mm512_set1_ps(w.krow[c][d]);
        for (int v = 0; v < RV; ++v)
          acc[v] = _mm512_fmadd_ps(kv, _mm512_loadu_ps(qt + d * kRows + v * 16), acc[v]);
      }
      for (int v = 0; v < RV; ++v) _mm512_storeu_ps(st + c * kRows + v * 16, acc[v]);
    }
  }

  // O^T[d][rows] = alpha[rows] * O^T[d][rows] + sum_c V[c][d] P^T[c][rows].
  template <int RV>
  static void accumulate_wide(const Problem& P, int64_t nk, const __m512* alpha, Scratch& w) {
    const int64_t D = P.D;
    const float* pt = w.st.data();
    float* ot = w.ot;
    for (int64_t d = 0; d < D; d += 4) {
      __m512 acc[4][RV];
      for (int i = 0; i < 4; ++i)
        for (int v = 0; v < RV; ++v)
          acc[i][v] = _mm512_mul_ps(_mm512_loadu_ps(ot + (d + i) * kRows + v * 16), alpha[v]);
      for (int64_t c = 0; c < nk; ++c) {
        __m512 p[RV];
        for (int v = 0; v < RV; ++v) {
          p[v] = _mm512_loadu_ps(pt + c * kRows + v * 16);
          keep(p[v]);
        }
        for (int i = 0; i < 4; ++i) {
          const __m512 vv = _mm512_set1_ps(w.vrow[c][d + i]);
          for (int v = 0; v < RV; ++v) acc[i][v] = _mm512_fmadd_ps(vv, p[v], acc[i][v]);
        }
      }
      for (int i = 0; i < 4; ++i)
        for (int v = 0; v < RV; ++v) _mm512_storeu_ps(ot + (d + i) * kRows + v * 16, acc[i][v]);
    }
  }

#if defined(RADIXKV_ON_AVX2)
  // The avx2 build's tiles, in native 256-bit vectors: the 16-lane tiles above need 32
  // registers (16 accumulators of two halves) and spill on 16 ymm. Here a tile is 2 keys (or 2
  // dims) x YN row vectors of 8 (at most 4: 8 accumulators + 2 broadcasts + 1 load), run over
  // the rows 32 at a time. Each lane's chain of FMAs is the same as above, in the same order.
  template <int YN>
  static void scores_y(const float* qt, const float* const* krow, int64_t D, int64_t nk,
                       int64_t r0, float* st) {
    int64_t c = 0;
    for (; c + 2 <= nk; c += 2) {
      __m256 a0[YN], a1[YN];
      for (int j = 0; j < YN; ++j) a0[j] = a1[j] = _mm256_setzero_ps();
      for (int64_t d = 0; d < D; ++d) {
        const __m256 b0 = _mm256_broadcast_ss(krow[c] + d);
        const __m256 b1 = _mm256_broadcast_ss(krow[c + 1] + d);
        for (int j = 0; j < YN; ++j) {
          const __m256 q = _mm256_loadu_ps(qt + d * kRows + r0 + 8 * j);
          a0[j] = _mm256_fmadd_ps(b0, q, a0[j]);
          a1[j] = _mm256_fmadd_ps(b1, q, a1[j]);
        }
      }
      for (int j = 0; j < YN; ++j) {
        _mm256_storeu_ps(st + c * kRows + r0 + 8 * j, a0[j]);
        _mm256_storeu_ps(st + (c + 1) * kRows + r0 + 8 * j, a1[j]);
      }
    }
    if (c < nk) {
      __m256 a0[YN];
      for (int j = 0; j < YN; ++j) a0[j] = _mm256_setzero_ps();
      for (int64_t d = 0; d < D; ++d) {
        const __m256 b0 = _mm256_broadcast_ss(krow[c] + d);
        for (int j = 0; j < YN; ++j)
          a0[j] = _mm256_fmadd_ps(b0, _mm256_loadu_ps(qt + d * kRows + r0 + 8 * j), a0[j]);
      }
      for (int j = 0; j < YN; ++j) _mm256_storeu_ps(st + c * kRows + r0 + 8 * j, a0[j]);
    }
  }

  template <int YN>
  static void accumulate_y(const float* pt, const float* const* vrow, int64_t D, int64_t nk,
                           int64_t r0, const float* alpha, float* ot) {
    for (int64_t d = 0; d < D; d += 2) {  // D is a multiple of 16
      __m256 a0[YN], a1[YN];
      for (int j = 0; j < YN; ++j) {
        const __m256 al = _mm256_loadu_ps(alpha + r0 + 8 * j);
        a0[j] = _mm256_mul_ps(_mm256_loadu_ps(ot + d * kRows + r0 + 8 * j), al);
        a1[j] = _mm256_mul_ps(_mm256_loadu_ps(ot + (d + 1) * kRows + r0 + 8 * j), al);
      }
      for (int64_t c = 0; c < nk; ++c) {
        const __m256 b0 = _mm256_broadcast_ss(vrow[c] + d);
        const __m256 b1 = _mm256_broadcast_ss(vrow[c] + d + 1);
        for (int j = 0; j < YN; ++j) {
          const __m256 p = _mm256_loadu_ps(pt + c * kRows + r0 + 8 * j);
          a0[j] = _mm256_fmadd_ps(b0, p, a0[j]);
          a1[j] = _mm256_fmadd_ps(b1, p, a1[j]);
        }
      }
      for (int j = 0; j < YN; ++j) {
        _mm256_storeu_ps(ot + d * kRows + r0 + 8 * j, a0[j]);
        _mm256_storeu_ps(ot + (d + 1) * kRows + r0 + 8 * j, a1[j]);
      }
    }
  }

  template <int RV>
  static void scores(const Problem& P, int64_t nk, Scratch& w) {
    constexpr int64_t full = RV / 2 * 32;  // rows in whole groups of 4 row vectors of 8
    for (int64_t r0 = 0; r0 < full; r0 += 32) scores_y<4>(w.qt, w.krow, P.D, nk, r0, w.st.data());
    if constexpr (RV % 2 != 0) scores_y<2>(w.qt, w.krow, P.D, nk, full, w.st.data());
  }

  template <int RV>
  static void accumulate(const Problem& P, int64_t nk, const __m512* alpha, Scratch& w) {
    alignas(32) float al[RV * 16];
    for (int v = 0; v < RV; ++v) {
      _mm256_storeu_ps(al + 16 * v, alpha[v].lo);
      _mm256_storeu_ps(al + 16 * v + 8, alpha[v].hi);
    }
    constexpr int64_t full = RV / 2 * 32;
    const float* pt = w.st.data();
    for (int64_t r0 = 0; r0 < full; r0 += 32) accumulate_y<4>(pt, w.vrow, P.D, nk, r0, al, w.ot);
    if constexpr (RV % 2 != 0) accumulate_y<2>(pt, w.vrow, P.D, nk, full, al, w.ot);
  }
#else
  template <int RV>
  static void scores(const Problem& P, int64_t nk, Scratch& w) {
    scores_wide<RV>(P, nk, w);
  }

  template <int RV>
  static void accumulate(const Problem& P, int64_t nk, const __m512* alpha, Scratch& w) {
    accumulate_wide<RV>(P, nk, alpha, w);
  }
#endif
};

}  // namespace radixkv_extend
#endif

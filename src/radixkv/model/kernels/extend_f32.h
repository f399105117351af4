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
  static void scores(const Problem& P, int64_t nk, Scratch& w) {
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
  static void accumulate(const Problem& P, int64_t nk, const __m512* alpha, Scratch& w) {
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
};

}  // namespace radixkv_extend
#endif

// The extend kernel's products for bfloat16 pools on CPUs with AVX-512 BF16: VDPBF16PS multiplies
// pairs of bf16 values and accumulates in f32, so each instruction does the work of two FMAs.
// Operands are kept as bf16 pairs (one 32-bit lane holds (x[2i], x[2i+1]), the low half first):
//   Q^T  pairs along d:    qt2[d/2][rows]    (the pool's own pairs, read as 32-bit words)
//   K    pairs along d:    kb2[key][d/2]     broadcast one pair against 16 rows
//   V    pairs along keys: vb2[key/2][d]     (two rows interleaved)
//   P^T  pairs along keys: pt2[key/2][rows]  (the f32 softmax weights rounded to bf16, as
//                                             flash-attention kernels do; sums stay f32).
// The softmax scale is applied to the f32 scores, not to the bf16 queries.
#pragma once

#include <cstring>

#include "extend_common.h"

#if defined(__AVX512BF16__)
namespace radixkv_extend {

struct BF16Products {
  static void load_q(const Problem& P, const c10::BFloat16* q, const Item& it, int64_t rows,
                     Scratch& w) {
    const int64_t G = P.G, D2 = P.D / 2;
    uint32_t* qt2 = w.qt2;
    std::fill(qt2, qt2 + D2 * kRows, 0u);
    for (int64_t ri = 0; ri < rows; ++ri) {
      const c10::BFloat16* row =
          q + (P.q_start[it.r] + it.t0 + ri / G) * P.q_row + (it.h * G + ri % G) * P.D;
      for (int64_t dp = 0; dp < D2; ++dp) std::memcpy(qt2 + dp * kRows + ri, row + 2 * dp, 4);
    }
  }

  static void load_keys(const Problem& P, const c10::BFloat16* k, const c10::BFloat16* v,
                        const int64_t* sl, int64_t kb0, int64_t nk, int64_t h, Scratch& w) {
    const int64_t D = P.D;
    for (int64_t c = 0; c < nk; ++c)
      std::memcpy(w.kb2.data() + c * D / 2, k + sl[kb0 + c] * P.k_row + h * P.k_head, D * 2);
    const __m512i idx = interleave_idx();
    uint32_t* vb2 = w.vb2.data();
    for (int64_t c = 0; c < nk; c += 2) {
      const c10::BFloat16* a = v + sl[kb0 + c] * P.v_row + h * P.v_head;
      const c10::BFloat16* b = c + 1 < nk ? v + sl[kb0 + c + 1] * P.v_row + h * P.v_head : nullptr;
      for (int64_t d = 0; d < D; d += 16) {
        const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + d));
        const __m256i hi = b ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + d))
                             : _mm256_setzero_si256();
        const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        _mm512_storeu_si512(vb2 + (c / 2) * D + d, _mm512_permutexvar_epi16(idx, both));
      }
    }
  }

  template <int RV>
  static void scores(const Problem& P, int64_t nk, Scratch& w) {
    const int64_t D2 = P.D / 2;
    const uint32_t* qt2 = w.qt2;
    const uint32_t* kb2 = w.kb2.data();
    float* st = w.st.data();
    const __m512 scale = _mm512_set1_ps(P.scale);
    int64_t c = 0;
    for (; c + 4 <= nk; c += 4) {
      __m512 acc[4][RV];
      for (int i = 0; i < 4; ++i)
        for (int v = 0; v < RV; ++v) acc[i][v] = _mm512_setzero_ps();
      for (int64_t dp = 0; dp < D2; ++dp) {
        __m512i q[RV];
        for (int v = 0; v < RV; ++v) {
          q[v] = _mm512_loadu_si512(qt2 + dp * kRows + v * 16);
          keep(q[v]);
        }
        for (int i = 0; i < 4; ++i) {
          const __m512i kv = _mm512_set1_epi32(static_cast<int>(kb2[(c + i) * D2 + dp]));
          for (int v = 0; v < RV; ++v)
            acc[i][v] = _mm512_dpbf16_ps(acc[i][v], (__m512bh)kv, (__m512bh)q[v]);
        }
      }
      for (int i = 0; i < 4; ++i)
        for (int v = 0; v < RV; ++v)
          _mm512_storeu_ps(st + (c + i) * kRows + v * 16, _mm512_mul_ps(acc[i][v], scale));
    }
    for (; c < nk; ++c) {
      __m512 acc[RV];
      for (int v = 0; v < RV; ++v) acc[v] = _mm512_setzero_ps();
      for (int64_t dp = 0; dp < D2; ++dp) {
        const __m512i kv = _mm512_set1_epi32(static_cast<int>(kb2[c * D2 + dp]));
        for (int v = 0; v < RV; ++v)
          acc[v] = _mm512_dpbf16_ps(acc[v], (__m512bh)kv,
                                    (__m512bh)_mm512_loadu_si512(qt2 + dp * kRows + v * 16));
      }
      for (int v = 0; v < RV; ++v)
        _mm512_storeu_ps(st + c * kRows + v * 16, _mm512_mul_ps(acc[v], scale));
    }
  }

  template <int RV>
  static void accumulate(const Problem& P, int64_t nk, const __m512* alpha, Scratch& w) {
    const int64_t D = P.D, np = (nk + 1) / 2;
    const float* pt = w.st.data();
    uint32_t* pt2 = w.pt2.data();
    const uint32_t* vb2 = w.vb2.data();
    float* ot = w.ot;
    const __m512i idx = interleave_idx();
    for (int64_t cp = 0; cp < np; ++cp)
      for (int v = 0; v < RV; ++v) {
        const __m512 lo = _mm512_loadu_ps(pt + 2 * cp * kRows + v * 16);
        const __m512 hi = 2 * cp + 1 < nk ? _mm512_loadu_ps(pt + (2 * cp + 1) * kRows + v * 16)
                                          : _mm512_setzero_ps();
        const __m512i pairs = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
        _mm512_storeu_si512(pt2 + cp * kRows + v * 16, _mm512_permutexvar_epi16(idx, pairs));
      }
    for (int64_t d = 0; d < D; d += 4) {
      __m512 acc[4][RV];
      for (int i = 0; i < 4; ++i)
        for (int v = 0; v < RV; ++v)
          acc[i][v] = _mm512_mul_ps(_mm512_loadu_ps(ot + (d + i) * kRows + v * 16), alpha[v]);
      for (int64_t cp = 0; cp < np; ++cp) {
        __m512i p[RV];
        for (int v = 0; v < RV; ++v) {
          p[v] = _mm512_loadu_si512(pt2 + cp * kRows + v * 16);
          keep(p[v]);
        }
        // With nk odd, the last pair's high half may hold key nk (loaded for a later sub-block
        // of the item): it is cleared, as the zero padding of a block of nk keys would be.
        const uint32_t half = 2 * cp + 1 < nk ? 0xFFFFFFFFu : 0x0000FFFFu;
        for (int i = 0; i < 4; ++i) {
          const __m512i vv = _mm512_set1_epi32(static_cast<int>(vb2[cp * D + d + i] & half));
          for (int v = 0; v < RV; ++v)
            acc[i][v] = _mm512_dpbf16_ps(acc[i][v], (__m512bh)vv, (__m512bh)p[v]);
        }
      }
      for (int i = 0; i < 4; ++i)
        for (int v = 0; v < RV; ++v) _mm512_storeu_ps(ot + (d + i) * kRows + v * 16, acc[i][v]);
    }
  }
};

}  // namespace radixkv_extend
#endif

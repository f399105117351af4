// AVX-512 helpers shared by the attention kernels: loads of 16 elements as f32 lanes, and exp for
// softmax arguments (x <= 0 after the running max is subtracted).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "isa.h"

namespace radixkv_simd {

inline float to_f(float x) { return x; }
inline float to_f(c10::BFloat16 x) { return static_cast<float>(x); }
inline float to_f(c10::Half x) { return static_cast<float>(x); }

// Prefetch into L2 the K and V rows (`bytes` each, at k + sl[c] * k_row + k_off and likewise in
// v) of keys c in [0, n): a context's rows are scattered over the pool, so the hardware
// prefetcher cannot follow them. The attention kernels call it for the next 64-key block while
// the current one computes, which keeps more of its misses in flight.
template <typename T>
inline void prefetch_kv(const T* k, const T* v, const int64_t* sl, int64_t n, int64_t k_row,
                        int64_t k_off, int64_t v_row, int64_t v_off, int64_t bytes) {
  for (int64_t c = 0; c < n; ++c) {
    const char* kp = reinterpret_cast<const char*>(k + sl[c] * k_row + k_off);
    const char* vp = reinterpret_cast<const char*>(v + sl[c] * v_row + v_off);
    for (int64_t b = 0; b < bytes; b += 64) {
      __builtin_prefetch(kp + b, 0, 2);
      __builtin_prefetch(vp + b, 0, 2);
    }
  }
}

}  // namespace radixkv_simd

#if defined(RADIXKV_AVX512)

namespace radixkv_simd {

// 16 elements of a row as f32 lanes.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// exp for x <= 0: 2^k * p(r), r = x - k ln 2 in [-ln2/2, ln2/2], p the degree-6 Taylor polynomial
// (relative error < 2e-7); exactly 0 below -87 and for -inf (masked keys must weigh nothing).
inline __m512 exp_neg(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145752f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.42860677e-6f), r);
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, k));
}

// In-register transpose of 16 rows of 16 32-bit words: out[c] = (r[0][c], ..., r[15][c]).
inline void transpose16(__m512* r) {
  __m512 a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a0 = _mm512_castps_pd(a[4 * i]), a1 = _mm512_castps_pd(a[4 * i + 1]);
    const __m512d a2 = _mm512_castps_pd(a[4 * i + 2]), a3 = _mm512_castps_pd(a[4 * i + 3]);
    b[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
    b[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
    b[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
    b[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
  }
  for (int j = 0; j < 4; ++j) {
    const __m512 c0 = _mm512_shuffle_f32x4(b[j], b[4 + j], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512 c1 = _mm512_shuffle_f32x4(b[j], b[4 + j], _MM_SHUFFLE(3, 1, 3, 1));
    const __m512 c2 = _mm512_shuffle_f32x4(b[8 + j], b[12 + j], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512 c3 = _mm512_shuffle_f32x4(b[8 + j], b[12 + j], _MM_SHUFFLE(3, 1, 3, 1));
    r[j] = _mm512_shuffle_f32x4(c0, c2, _MM_SHUFFLE(2, 0, 2, 0));
    r[4 + j] = _mm512_shuffle_f32x4(c1, c3, _MM_SHUFFLE(2, 0, 2, 0));
    r[8 + j] = _mm512_shuffle_f32x4(c0, c2, _MM_SHUFFLE(3, 1, 3, 1));
    r[12 + j] = _mm512_shuffle_f32x4(c1, c3, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// Word indices that interleave the two 16-word halves of a vector: (a0, b0, a1, b1, ...) — two
// bf16 rows made into the (row 2c, row 2c+1) pairs VDPBF16PS reads.
inline __m512i interleave_idx() {
  alignas(64) int16_t idx[32];
  for (int i = 0; i < 16; ++i) {
    idx[2 * i] = static_cast<int16_t>(i);
    idx[2 * i + 1] = static_cast<int16_t>(16 + i);
  }
  return _mm512_load_si512(idx);
}

// The lanes [0, n) of a 16-lane tail (n < 16 allowed; n >= 16 means all).
inline __mmask16 lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
}

}  // namespace radixkv_simd
#endif

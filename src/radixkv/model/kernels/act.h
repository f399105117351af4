// The bf16 rounding and SiLU arithmetic shared by the element-wise kernel (pointwise.cpp) and the
// GEMM's fused gate/up epilogue (gemm_amx.h): one definition, so the fused product gives the bits
// of the GEMM followed by silu_mul.
#pragma once

#include "simd.h"

#if defined(RADIXKV_AVX512)
namespace radixkv_act {

using radixkv_isa::to_bf16;

// 16 bf16 values as f32 lanes.
inline __m512 widen_bf16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// silu(g) in f32: g / (1 + exp(-g)), with exp taken of -|g| only (no overflow).
inline __m512 silu16(__m512 g) {
  const __m512 e = radixkv_simd::exp_neg(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));
  const __m512 one = _mm512_set1_ps(1.f);
  const __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512 sig = _mm512_div_ps(_mm512_mask_mov_ps(one, neg, e), _mm512_add_ps(one, e));
  return _mm512_mul_ps(g, sig);
}

// gelu(g), tanh approximation, in f32: 0.5 g (1 + tanh(y)) = g * sigmoid(2y) with
// y = sqrt(2/pi) (g + 0.044715 g^3); the sigmoid as in silu16 (exp of -|2y| only), which keeps
// full relative precision near 0 where 1 + tanh(y) would not cancel but tanh's exp form would.
inline __m512 gelu_tanh16(__m512 g) {
  const __m512 g3 = _mm512_mul_ps(_mm512_mul_ps(g, g), g);
  const __m512 inner = _mm512_add_ps(g, _mm512_mul_ps(_mm512_set1_ps(0.044715f), g3));
  const __m512 a = _mm512_mul_ps(_mm512_set1_ps(2.f * 0.7978845608028654f), inner);
  const __m512 e = radixkv_simd::exp_neg(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(a)));
  const __m512 one = _mm512_set1_ps(1.f);
  const __mmask16 neg = _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512 sig = _mm512_div_ps(_mm512_mask_mov_ps(one, neg, e), _mm512_add_ps(one, e));
  return _mm512_mul_ps(g, sig);
}

// silu_mul in bf16 on widened values: bf16(bf16(silu(g)) * u).
inline __m256i silu_mul_bf16(__m512 g, __m512 u) {
  return to_bf16(_mm512_mul_ps(widen_bf16(to_bf16(silu16(g))), u));
}

}  // namespace radixkv_act
#endif

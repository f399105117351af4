// The AVX-512 intrinsics the kernels use, for CPUs with AVX2 + FMA + F16C and no AVX-512 (most
// Zen 2/3 and pre-Skylake-X Intel machines): a 16-lane vector is two 256-bit halves (lanes 0-7,
// 8-15), and every operation does, lane by lane, the arithmetic of the AVX-512 instruction it
// stands for. So the kernels' code and reduction order are the very ones of the AVX-512 build:
// an AVX2 CPU computes the same bits as an AVX-512F CPU without AVX-512 BF16 (IEEE operations
// only: FMA, add, mul, div, max, conversions; the horizontal sums fold in the same tree as GCC's
// _mm512_reduce_add_ps). isa.h includes this only in a build without AVX-512 (the "avx2" build,
// radixkv.model.kernels); the BF16 and AMX code stays out of it (their guards are not defined).
//
// Restrictions, each met by every caller: _mm512_scalef_ps takes integral exponents in
// [-126, 127] (exp's 2^k); masks are any 16 bits. Register pressure is higher than on AVX-512
// (16 ymm registers, not 32 zmm): the GEMM takes smaller tiles here (gemm.cpp).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace radixkv_avx2 {

struct V16f {
  __m256 lo, hi;
};
struct V16i {
  __m256i lo, hi;
};
struct V16d {
  __m256d lo, hi;
};

#define RKV_INL inline __attribute__((always_inline))

// Lane i of the result is all ones where bit i of k is set.
RKV_INL V16i mask_vec(uint16_t k) {
  const __m256i bits_lo = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i bits_hi = _mm256_slli_epi32(bits_lo, 8);
  const __m256i kv = _mm256_set1_epi32(k);
  return {_mm256_cmpeq_epi32(_mm256_and_si256(kv, bits_lo), bits_lo),
          _mm256_cmpeq_epi32(_mm256_and_si256(kv, bits_hi), bits_hi)};
}
RKV_INL V16f blend(V16f a, V16f b, uint16_t k) {  // lanes of b where k is set, else a
  const V16i m = mask_vec(k);
  return {_mm256_blendv_ps(a.lo, b.lo, _mm256_castsi256_ps(m.lo)),
          _mm256_blendv_ps(a.hi, b.hi, _mm256_castsi256_ps(m.hi))};
}

RKV_INL V16f set1_ps(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
RKV_INL V16f setzero_ps() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
RKV_INL V16i set1_epi32(int x) { return {_mm256_set1_epi32(x), _mm256_set1_epi32(x)}; }
RKV_INL V16i set_epi32(int e15, int e14, int e13, int e12, int e11, int e10, int e9, int e8,
                       int e7, int e6, int e5, int e4, int e3, int e2, int e1, int e0) {
  return {_mm256_set_epi32(e7, e6, e5, e4, e3, e2, e1, e0),
          _mm256_set_epi32(e15, e14, e13, e12, e11, e10, e9, e8)};
}
RKV_INL V16f loadu_ps(const void* p) {
  const float* f = static_cast<const float*>(p);
  return {_mm256_loadu_ps(f), _mm256_loadu_ps(f + 8)};
}
RKV_INL void storeu_ps(void* p, V16f v) {
  float* f = static_cast<float*>(p);
  _mm256_storeu_ps(f, v.lo);
  _mm256_storeu_ps(f + 8, v.hi);
}
RKV_INL V16i loadu_si512(const void* p) {
  const __m256i* q = static_cast<const __m256i*>(p);
  return {_mm256_loadu_si256(q), _mm256_loadu_si256(q + 1)};
}
RKV_INL void storeu_si512(void* p, V16i v) {
  __m256i* q = static_cast<__m256i*>(p);
  _mm256_storeu_si256(q, v.lo);
  _mm256_storeu_si256(q + 1, v.hi);
}
RKV_INL V16f maskz_loadu_ps(uint16_t k, const void* p) {  // masked lanes are not read
  const V16i m = mask_vec(k);
  const float* f = static_cast<const float*>(p);
  return {_mm256_maskload_ps(f, m.lo), _mm256_maskload_ps(f + 8, m.hi)};
}
RKV_INL void mask_storeu_ps(void* p, uint16_t k, V16f v) {
  const V16i m = mask_vec(k);
  float* f = static_cast<float*>(p);
  _mm256_maskstore_ps(f, m.lo, v.lo);
  _mm256_maskstore_ps(f + 8, m.hi, v.hi);
}
RKV_INL __m256i maskz_loadu_epi16(uint16_t k, const void* p) {
  if (k == 0xFFFF) return _mm256_loadu_si256(static_cast<const __m256i*>(p));
  alignas(32) uint16_t buf[16] = {};
  const uint16_t* s = static_cast<const uint16_t*>(p);
  for (int i = 0; i < 16; ++i)
    if (k >> i & 1) buf[i] = s[i];
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
}
RKV_INL void mask_storeu_epi16(void* p, uint16_t k, __m256i v) {
  if (k == 0xFFFF) return _mm256_storeu_si256(static_cast<__m256i*>(p), v);
  alignas(32) uint16_t buf[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(buf), v);
  uint16_t* d = static_cast<uint16_t*>(p);
  for (int i = 0; i < 16; ++i)
    if (k >> i & 1) d[i] = buf[i];
}

#define RKV_BIN(NAME, OP)                                                        \
  RKV_INL V16f NAME(V16f a, V16f b) { return {OP(a.lo, b.lo), OP(a.hi, b.hi)}; }
RKV_BIN(add_ps, _mm256_add_ps)
RKV_BIN(sub_ps, _mm256_sub_ps)
RKV_BIN(mul_ps, _mm256_mul_ps)
RKV_BIN(div_ps, _mm256_div_ps)
RKV_BIN(max_ps, _mm256_max_ps)
RKV_BIN(unpacklo_ps, _mm256_unpacklo_ps)  // per 128-bit lane, as the AVX-512 forms
RKV_BIN(unpackhi_ps, _mm256_unpackhi_ps)
#undef RKV_BIN
RKV_INL V16f fmadd_ps(V16f a, V16f b, V16f c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
RKV_INL V16f fnmadd_ps(V16f a, V16f b, V16f c) {
  return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
RKV_INL V16f abs_ps(V16f a) {
  const __m256 m = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  return {_mm256_and_ps(a.lo, m), _mm256_and_ps(a.hi, m)};
}
RKV_INL V16d unpacklo_pd(V16d a, V16d b) {
  return {_mm256_unpacklo_pd(a.lo, b.lo), _mm256_unpacklo_pd(a.hi, b.hi)};
}
RKV_INL V16d unpackhi_pd(V16d a, V16d b) {
  return {_mm256_unpackhi_pd(a.lo, b.lo), _mm256_unpackhi_pd(a.hi, b.hi)};
}
RKV_INL V16f maskz_mov_ps(uint16_t k, V16f a) { return blend(setzero_ps(), a, k); }
RKV_INL V16f mask_mov_ps(V16f src, uint16_t k, V16f a) { return blend(src, a, k); }
RKV_INL V16f mask_max_ps(V16f src, uint16_t k, V16f a, V16f b) {
  return blend(src, max_ps(a, b), k);
}
RKV_INL V16f mask_add_ps(V16f src, uint16_t k, V16f a, V16f b) {
  return blend(src, add_ps(a, b), k);
}
RKV_INL V16f maskz_mul_ps(uint16_t k, V16f a, V16f b) { return maskz_mov_ps(k, mul_ps(a, b)); }
template <int kPred>
RKV_INL uint16_t cmp_ps_mask(V16f a, V16f b) {
  const int lo = _mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, kPred));
  const int hi = _mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, kPred));
  return static_cast<uint16_t>(lo | hi << 8);
}
template <int kImm>
RKV_INL V16f roundscale_ps(V16f a) {  // scale 0 (the only form used): round to an integer
  static_assert((kImm >> 4) == 0, "only roundscale to integers");
  return {_mm256_round_ps(a.lo, kImm & 0xF), _mm256_round_ps(a.hi, kImm & 0xF)};
}
// a * 2^b for integral b in [-126, 127]: one multiply by an exact power of two, rounded once,
// as VSCALEFPS rounds its result.
RKV_INL V16f scalef_ps(V16f a, V16f b) {
  const auto pow2 = [](__m256 e) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(e), _mm256_set1_epi32(127)), 23));
  };
  return {_mm256_mul_ps(a.lo, pow2(b.lo)), _mm256_mul_ps(a.hi, pow2(b.hi))};
}

RKV_INL V16f castsi512_ps(V16i a) { return {_mm256_castsi256_ps(a.lo), _mm256_castsi256_ps(a.hi)}; }
RKV_INL V16i castps_si512(V16f a) { return {_mm256_castps_si256(a.lo), _mm256_castps_si256(a.hi)}; }
RKV_INL V16d castps_pd(V16f a) { return {_mm256_castps_pd(a.lo), _mm256_castps_pd(a.hi)}; }
RKV_INL V16f castpd_ps(V16d a) { return {_mm256_castpd_ps(a.lo), _mm256_castpd_ps(a.hi)}; }
RKV_INL V16i castsi256_si512(__m256i a) { return {a, _mm256_setzero_si256()}; }
template <int kImm>
RKV_INL V16i inserti64x4(V16i a, __m256i b) {
  return kImm & 1 ? V16i{a.lo, b} : V16i{b, a.hi};
}
template <int kImm>
RKV_INL V16i slli_epi32(V16i a) {
  return {_mm256_slli_epi32(a.lo, kImm), _mm256_slli_epi32(a.hi, kImm)};
}
template <int kImm>
RKV_INL V16i srli_epi32(V16i a) {
  return {_mm256_srli_epi32(a.lo, kImm), _mm256_srli_epi32(a.hi, kImm)};
}
RKV_INL V16i and_si512(V16i a, V16i b) {
  return {_mm256_and_si256(a.lo, b.lo), _mm256_and_si256(a.hi, b.hi)};
}
RKV_INL V16i add_epi32(V16i a, V16i b) {
  return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)};
}
RKV_INL V16i cvtepu16_epi32(__m256i h) {
  return {_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)),
          _mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1))};
}
RKV_INL __m256i cvtepi32_epi16(V16i a) {  // truncation: the low 16 bits of each lane
  const __m256i low = _mm256_set1_epi32(0xFFFF);
  const __m256i packed = _mm256_packus_epi32(_mm256_and_si256(a.lo, low), _mm256_and_si256(a.hi, low));
  return _mm256_permute4x64_epi64(packed, 0xD8);  // packus interleaves the 128-bit lanes
}
RKV_INL V16f cvtph_ps(__m256i h) {
  return {_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
}
template <int kImm>
RKV_INL __m256i cvtps_ph(V16f a) {
  return _mm256_setr_m128i(_mm256_cvtps_ph(a.lo, kImm), _mm256_cvtps_ph(a.hi, kImm));
}
RKV_INL float cvtss_f32(V16f a) { return _mm256_cvtss_f32(a.lo); }
RKV_INL V16f permutexvar_ps(V16i idx, V16f a) {  // lane i = a[idx[i] % 16]
  const auto half = [&](__m256i ix) {
    const __m256 from_lo = _mm256_permutevar8x32_ps(a.lo, ix);
    const __m256 from_hi = _mm256_permutevar8x32_ps(a.hi, ix);
    const __m256i upper = _mm256_slli_epi32(ix, 28);  // bit 3 of the index to the sign bit
    return _mm256_blendv_ps(from_lo, from_hi, _mm256_castsi256_ps(upper));
  };
  return {half(idx.lo), half(idx.hi)};
}
// Lane (128-bit) i of a 16-lane vector, i in [0, 4).
template <int kLane>
RKV_INL __m128 lane128(V16f a) {
  const __m256 h = kLane < 2 ? a.lo : a.hi;
  return kLane % 2 ? _mm256_extractf128_ps(h, 1) : _mm256_castps256_ps128(h);
}
template <int kImm>
RKV_INL V16f shuffle_f32x4(V16f a, V16f b) {
  return {_mm256_setr_m128(lane128<kImm & 3>(a), lane128<(kImm >> 2) & 3>(a)),
          _mm256_setr_m128(lane128<(kImm >> 4) & 3>(b), lane128<(kImm >> 6) & 3>(b))};
}
// GCC's _mm512_reduce_add_ps / _mm512_reduce_max_ps trees, step for step.
RKV_INL float reduce_add_ps(V16f a) {
  const __m256 t3 = _mm256_add_ps(a.hi, a.lo);
  const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
  const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, 1));
}
RKV_INL float reduce_max_ps(V16f a) {
  const __m256 t3 = _mm256_max_ps(a.hi, a.lo);
  const __m128 t6 = _mm_max_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
  const __m128 t8 = _mm_max_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m128 t10 = _mm_max_ps(t8, _mm_shuffle_ps(t8, t8, _MM_SHUFFLE(0, 1, 0, 1)));
  return _mm_cvtss_f32(t10);
}

#undef RKV_INL
}  // namespace radixkv_avx2

// The AVX-512 names the kernels use, on the halves above.
#define __m512 radixkv_avx2::V16f
#define __m512i radixkv_avx2::V16i
#define __m512d radixkv_avx2::V16d
#define _mm512_set1_ps radixkv_avx2::set1_ps
#define _mm512_setzero_ps radixkv_avx2::setzero_ps
#define _mm512_set1_epi32 radixkv_avx2::set1_epi32
#define _mm512_set_epi32 radixkv_avx2::set_epi32
#define _mm512_loadu_ps radixkv_avx2::loadu_ps
#define _mm512_load_ps radixkv_avx2::loadu_ps
#define _mm512_storeu_ps radixkv_avx2::storeu_ps
#define _mm512_store_ps radixkv_avx2::storeu_ps
#define _mm512_loadu_si512 radixkv_avx2::loadu_si512
#define _mm512_load_si512 radixkv_avx2::loadu_si512
#define _mm512_storeu_si512 radixkv_avx2::storeu_si512
#define _mm512_store_si512 radixkv_avx2::storeu_si512
#define _mm512_maskz_loadu_ps radixkv_avx2::maskz_loadu_ps
#define _mm512_mask_storeu_ps radixkv_avx2::mask_storeu_ps
#define _mm256_maskz_loadu_epi16 radixkv_avx2::maskz_loadu_epi16
#define _mm256_mask_storeu_epi16 radixkv_avx2::mask_storeu_epi16
#define _mm512_add_ps radixkv_avx2::add_ps
#define _mm512_sub_ps radixkv_avx2::sub_ps
#define _mm512_mul_ps radixkv_avx2::mul_ps
#define _mm512_div_ps radixkv_avx2::div_ps
#define _mm512_max_ps radixkv_avx2::max_ps
#define _mm512_fmadd_ps radixkv_avx2::fmadd_ps
#define _mm512_fnmadd_ps radixkv_avx2::fnmadd_ps
#define _mm512_abs_ps radixkv_avx2::abs_ps
#define _mm512_unpacklo_ps radixkv_avx2::unpacklo_ps
#define _mm512_unpackhi_ps radixkv_avx2::unpackhi_ps
#define _mm512_unpacklo_pd radixkv_avx2::unpacklo_pd
#define _mm512_unpackhi_pd radixkv_avx2::unpackhi_pd
#define _mm512_maskz_mov_ps radixkv_avx2::maskz_mov_ps
#define _mm512_mask_mov_ps radixkv_avx2::mask_mov_ps
#define _mm512_mask_max_ps radixkv_avx2::mask_max_ps
#define _mm512_mask_add_ps radixkv_avx2::mask_add_ps
#define _mm512_maskz_mul_ps radixkv_avx2::maskz_mul_ps
#define _mm512_cmp_ps_mask(a, b, p) radixkv_avx2::cmp_ps_mask<(p)>(a, b)
#define _mm512_roundscale_ps(a, i) radixkv_avx2::roundscale_ps<(i)>(a)
#define _mm512_scalef_ps radixkv_avx2::scalef_ps
#define _mm512_castsi512_ps radixkv_avx2::castsi512_ps
#define _mm512_castps_si512 radixkv_avx2::castps_si512
#define _mm512_castps_pd radixkv_avx2::castps_pd
#define _mm512_castpd_ps radixkv_avx2::castpd_ps
#define _mm512_castsi256_si512 radixkv_avx2::castsi256_si512
#define _mm512_inserti64x4(a, b, i) radixkv_avx2::inserti64x4<(i)>(a, b)
#define _mm512_slli_epi32(a, i) radixkv_avx2::slli_epi32<(i)>(a)
#define _mm512_srli_epi32(a, i) radixkv_avx2::srli_epi32<(i)>(a)
#define _mm512_and_si512 radixkv_avx2::and_si512
#define _mm512_add_epi32 radixkv_avx2::add_epi32
#define _mm512_cvtepu16_epi32 radixkv_avx2::cvtepu16_epi32
#define _mm512_cvtepi32_epi16 radixkv_avx2::cvtepi32_epi16
#define _mm512_cvtph_ps radixkv_avx2::cvtph_ps
#define _mm512_cvtps_ph(a, i) radixkv_avx2::cvtps_ph<(i)>(a)
#define _mm512_cvtss_f32 radixkv_avx2::cvtss_f32
#define _mm512_permutexvar_ps radixkv_avx2::permutexvar_ps
#define _mm512_shuffle_f32x4(a, b, i) radixkv_avx2::shuffle_f32x4<(i)>(a, b)
#define _mm512_reduce_add_ps radixkv_avx2::reduce_add_ps
#define _mm512_reduce_max_ps radixkv_avx2::reduce_max_ps

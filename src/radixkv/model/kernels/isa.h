// Which vector ISA the kernels compile to. Natively AVX-512 (the "avx512" build, -march=native on
// an AVX-512 CPU), or AVX-512's operations on AVX2 + FMA + F16C (the "avx2" build, -march=haswell:
// avx512_on_avx2.h), with the same code and the same reduction order. RADIXKV_AVX512 guards every
// vector kernel; __AVX512BF16__ and RADIXKV_AMX guard the bfloat16 instructions, native only.
#pragma once

#include <immintrin.h>

#if defined(__AVX512F__)
#define RADIXKV_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "avx512_on_avx2.h"
#define RADIXKV_AVX512 1
#define RADIXKV_ON_AVX2 1
#endif

#if defined(RADIXKV_AVX512)
namespace radixkv_isa {

// f32 -> bfloat16, round to nearest even, as c10's conversion does (NaN aside; denormal inputs
// round as numbers, where VCVTNEPS2BF16 flushes them to zero): the rounding of every kernel but
// the AVX-512 BF16 GEMM epilogue's.
inline __m256i to_bf16(__m512 v) {
  const __m512i b = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), lsb);
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

}  // namespace radixkv_isa
#endif

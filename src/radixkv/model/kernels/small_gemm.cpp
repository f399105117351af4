// y = x W^T (+ b) for the few rows of a decode step (M <= 16 or so), on AVX-512 CPUs.
//
// At such M the product is bound by reading W once, and oneDNN's kernels stream it at 15-21 GB/s
// on this project's CPUs; this kernel streams it at 24-41 GB/s. W is repacked once into blocks of
// 16 output features with K contiguous inside a block, so each thread reads long contiguous runs:
//   float32:  [N/16, K, 16]        one 16-lane FMA per (row, k), x[m, k] broadcast;
//   bfloat16: [N/16, K/2, 16, 2]   one VDPBF16PS per (row, k pair): the pair (k, k+1) of x[m]
//                                  broadcast as 32 bits against 16 outputs' pairs (the VNNI layout),
//                                  f32 accumulation, rounded to bf16 once at the end.
// Rows are done in tiles of up to 8 (8 accumulators per 16 outputs), so W is read once per 8 rows.
// Small tiles split K over several accumulators to hide the FMA latency chain.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kBlock = 16;  // output features per packed block

#if defined(__AVX512F__)
template <int MT, int U>
inline void tile_f32(const float* x, int64_t ldx, const float* w, int64_t K, const float* bias,
                     float* out, int64_t ldo) {
  __m512 acc[MT][U];
  for (int m = 0; m < MT; ++m)
    for (int u = 0; u < U; ++u) acc[m][u] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + U <= K; k += U) {
    _mm_prefetch(reinterpret_cast<const char*>(w + (k + 32) * kBlock), _MM_HINT_T0);
    for (int u = 0; u < U; ++u) {
      const __m512 wv = _mm512_loadu_ps(w + (k + u) * kBlock);
      for (int m = 0; m < MT; ++m)
        acc[m][u] = _mm512_fmadd_ps(_mm512_set1_ps(x[m * ldx + k + u]), wv, acc[m][u]);
    }
  }
  for (; k < K; ++k) {
    const __m512 wv = _mm512_loadu_ps(w + k * kBlock);
    for (int m = 0; m < MT; ++m)
      acc[m][0] = _mm512_fmadd_ps(_mm512_set1_ps(x[m * ldx + k]), wv, acc[m][0]);
  }
  const __m512 b = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  for (int m = 0; m < MT; ++m) {
    __m512 s = b;
    for (int u = 0; u < U; ++u) s = _mm512_add_ps(s, acc[m][u]);
    _mm512_storeu_ps(out + m * ldo, s);
  }
}
#endif

#if defined(__AVX512BF16__)
template <int MT, int U>
inline void tile_bf16(const uint32_t* x, int64_t ldx, const uint16_t* w, int64_t K2,
                      const float* bias, c10::BFloat16* out, int64_t ldo) {
  __m512 acc[MT][U];
  for (int m = 0; m < MT; ++m)
    for (int u = 0; u < U; ++u) acc[m][u] = _mm512_setzero_ps();
  int64_t kk = 0;
  for (; kk + U <= K2; kk += U) {
    _mm_prefetch(reinterpret_cast<const char*>(w + (kk + 32) * 2 * kBlock), _MM_HINT_T0);
    for (int u = 0; u < U; ++u) {
      const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + (kk + u) * 2 * kBlock);
      for (int m = 0; m < MT; ++m)
        acc[m][u] = _mm512_dpbf16_ps(
            acc[m][u], (__m512bh)_mm512_set1_epi32(static_cast<int>(x[m * ldx + kk + u])), wv);
    }
  }
  for (; kk < K2; ++kk) {
    const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + kk * 2 * kBlock);
    for (int m = 0; m < MT; ++m)
      acc[m][0] = _mm512_dpbf16_ps(
          acc[m][0], (__m512bh)_mm512_set1_epi32(static_cast<int>(x[m * ldx + kk])), wv);
  }
  const __m512 b = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  for (int m = 0; m < MT; ++m) {
    __m512 s = b;
    for (int u = 0; u < U; ++u) s = _mm512_add_ps(s, acc[m][u]);
    __m256bh h = _mm512_cvtneps_pbh(s);  // round to nearest even
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + m * ldo), (__m256i)h);
  }
}
#endif

// Calls tile<mt, U>(args...) for a runtime mt in 1..8; U = accumulators per row.
#define RKV_TILE_SWITCH(fn, mt, ...)                   \
  switch (mt) {                                        \
    case 8: fn<8, 1>(__VA_ARGS__); break;              \
    case 7: fn<7, 1>(__VA_ARGS__); break;              \
    case 6: fn<6, 1>(__VA_ARGS__); break;              \
    case 5: fn<5, 1>(__VA_ARGS__); break;              \
    case 4: fn<4, 2>(__VA_ARGS__); break;              \
    case 3: fn<3, 2>(__VA_ARGS__); break;              \
    case 2: fn<2, 4>(__VA_ARGS__); break;              \
    default: fn<1, 4>(__VA_ARGS__); break;             \
  }

void check(const torch::Tensor& x, const torch::Tensor& packed, int64_t n,
           const c10::optional<torch::Tensor>& bias, torch::ScalarType dtype) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous 2-D tensor");
  TORCH_CHECK(x.scalar_type() == dtype && packed.scalar_type() == dtype, "dtype mismatch");
  TORCH_CHECK(n % kBlock == 0 && packed.numel() == n * x.size(1), "packed weight does not fit x");
  TORCH_CHECK(!bias || (bias->scalar_type() == torch::kFloat && bias->numel() == n &&
                        bias->is_contiguous()),
              "bias must be a contiguous float32 vector of n values");
}

}  // namespace

bool small_gemm_f32_supported() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

bool small_gemm_bf16_supported() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

// w [N, K] -> the packed layout above (N % 16 == 0; bf16 also needs K % 2 == 0).
torch::Tensor small_gemm_pack(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.size(0) % kBlock == 0, "out features must be a multiple of 16");
  const int64_t n = w.size(0), k = w.size(1);
  if (w.scalar_type() == torch::kBFloat16) {
    TORCH_CHECK(k % 2 == 0, "bf16 packing needs an even number of in features");
    return w.contiguous().view({n / kBlock, kBlock, k / 2, 2}).permute({0, 2, 1, 3}).contiguous();
  }
  TORCH_CHECK(w.scalar_type() == torch::kFloat, "float32 or bfloat16 weights only");
  return w.contiguous().view({n / kBlock, kBlock, k}).transpose(1, 2).contiguous();
}

// x [M, K] (contiguous) times the packed W [N, K] -> [M, N] in x's dtype; bias f32 [N] or none.
torch::Tensor small_gemm(torch::Tensor x, torch::Tensor packed, int64_t n,
                         c10::optional<torch::Tensor> bias) {
  const int64_t m_rows = x.size(0), k = x.size(1);
  auto out = torch::empty({m_rows, n}, x.options());
  const float* bp = bias ? bias->data_ptr<float>() : nullptr;
  if (x.scalar_type() == torch::kFloat) {
#if defined(__AVX512F__)
    check(x, packed, n, bias, torch::kFloat);
    const float* xp = x.data_ptr<float>();
    const float* wp = packed.data_ptr<float>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, n / kBlock, 4, [&](int64_t begin, int64_t end) {
      for (int64_t nb = begin; nb < end; ++nb)
        for (int64_t m0 = 0; m0 < m_rows; m0 += 8) {
          const int64_t mt = std::min<int64_t>(8, m_rows - m0);
          RKV_TILE_SWITCH(tile_f32, mt, xp + m0 * k, k, wp + nb * k * kBlock, k,
                          bp ? bp + nb * kBlock : nullptr, op + m0 * n + nb * kBlock, n)
        }
    });
    return out;
#endif
  } else if (x.scalar_type() == torch::kBFloat16) {
#if defined(__AVX512BF16__)
    check(x, packed, n, bias, torch::kBFloat16);
    const int64_t k2 = k / 2;
    const auto* xp = reinterpret_cast<const uint32_t*>(x.data_ptr<c10::BFloat16>());
    const auto* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr<c10::BFloat16>());
    auto* op = out.data_ptr<c10::BFloat16>();
    at::parallel_for(0, n / kBlock, 4, [&](int64_t begin, int64_t end) {
      for (int64_t nb = begin; nb < end; ++nb)
        for (int64_t m0 = 0; m0 < m_rows; m0 += 8) {
          const int64_t mt = std::min<int64_t>(8, m_rows - m0);
          RKV_TILE_SWITCH(tile_bf16, mt, xp + m0 * k2, k2, wp + nb * k * kBlock, k2,
                          bp ? bp + nb * kBlock : nullptr, op + m0 * n + nb * kBlock, n)
        }
    });
    return out;
#endif
  }
  TORCH_CHECK(false, "small_gemm: unsupported dtype or CPU (", x.scalar_type(), ")");
}

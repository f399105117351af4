// The decoder layer's row-wise and element-wise steps with one fixed arithmetic: RMSNorm, SiLU(gate)
// * up, and RoPE. Each row (token) is computed by the same code whatever the row count, and the
// eager and compiled model call these same ops (inductor sees them as opaque extern calls), so
// neither the batch, nor the chunking, nor which path ran a step can change a bit of the result.
//
// Numerics follow the Hugging Face reference (so float32 logits stay within ~1e-5 of it):
//   rms_norm:  r = 1 / sqrt(mean(x^2) + eps) in f32 (squares summed in 16 f32 lanes over the row,
//              then a fixed pairwise fold of the lanes); y = w * T(x * r)  (HF: weight *
//              hidden.to(dtype), so bf16 rounds x * r before the weight multiply);
//   rms_norm_1p: the same statistics, y = T((x * r) * (1 + w)) in f32 (Gemma 3 / Qwen3.5: HF
//              scales by (1 + weight.float()) before the one cast);
//   silu_mul:  y = T(T(silu(g)) * u)  (F.silu's result is rounded to T first, as in eager torch);
//   gelu_tanh_mul: y = T(T(gelu_tanh(g)) * u), gelu as g * sigmoid(2 sqrt(2/pi) (g + 0.044715 g^3))
//              (equal to 0.5 g (1 + tanh(...)) in exact arithmetic);
//   rope:      (x1 c - x2 s, x2 c + x1 s) per half, products and difference in f32, rounded once.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>

#include "act.h"
#include "simd.h"

namespace {

using namespace radixkv_simd;
#if defined(RADIXKV_AVX512)
using radixkv_act::gelu_tanh16;
using radixkv_act::silu16;
using radixkv_act::to_bf16;
#endif

template <typename T>
inline T from_f(float x) { return static_cast<T>(x); }

// T(x) as f32 (the value a T store then load would give).
template <typename T>
inline float round_to(float x) { return static_cast<float>(static_cast<T>(x)); }

#if defined(RADIXKV_AVX512)
inline __m512 load16m(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16m(const c10::BFloat16* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 load16m(const c10::Half* p, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
inline void store16m(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
inline void store16m(c10::BFloat16* p, __m512 v, __mmask16 m) {
  _mm256_mask_storeu_epi16(p, m, to_bf16(v));
}
inline void store16m(c10::Half* p, __m512 v, __mmask16 m) {
  _mm256_mask_storeu_epi16(p, m, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
// The value of v after a store as T and a load back.
template <typename T>
inline __m512 round16(__m512 v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16(v)), 16));
  } else {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
}

// Sum of the 16 lanes: lane c + lane c + 8, then + 4, + 2, + 1.
inline float fold16(__m512 x) {
  const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (int s = 8; s >= 1; s /= 2) {
    const __m512i idx = _mm512_and_si512(_mm512_add_epi32(iota, _mm512_set1_epi32(s)),
                                         _mm512_set1_epi32(15));
    x = _mm512_add_ps(x, _mm512_permutexvar_ps(idx, x));
  }
  return _mm512_cvtss_f32(x);
}
#endif

// ONE_PLUS: y = T((x * r) * (1 + w)) (rms_norm_1p); else y = w * T(x * r) (rms_norm).
template <typename T, bool ONE_PLUS>
void rms_rows(const T* x, const T* w, T* y, int64_t rows, int64_t n, float eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * n;
      T* yr = y + r * n;
#if defined(RADIXKV_AVX512)
      __m512 acc = _mm512_setzero_ps();
      for (int64_t i = 0; i < n; i += 16) {
        const __m512 v = load16m(xr + i, lanes(n - i));
        acc = _mm512_fmadd_ps(v, v, acc);
      }
      const float inv = 1.f / std::sqrt(fold16(acc) / static_cast<float>(n) + eps);
      const __m512 iv = _mm512_set1_ps(inv);
      for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = lanes(n - i);
        const __m512 h = _mm512_mul_ps(load16m(xr + i, m), iv);
        if constexpr (ONE_PLUS) {
          const __m512 scale = _mm512_add_ps(_mm512_set1_ps(1.f), load16m(w + i, m));
          store16m(yr + i, _mm512_mul_ps(h, scale), m);
        } else {
          store16m(yr + i, _mm512_mul_ps(load16m(w + i, m), round16<T>(h)), m);
        }
      }
#else
      float ss = 0.f;
      for (int64_t i = 0; i < n; ++i) ss += to_f(xr[i]) * to_f(xr[i]);
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
      for (int64_t i = 0; i < n; ++i) {
        const float h = to_f(xr[i]) * inv;
        yr[i] = ONE_PLUS ? from_f<T>(h * (1.f + to_f(w[i]))) : from_f<T>(to_f(w[i]) * round_to<T>(h));
      }
#endif
    }
  });
}

inline float silu1(float g) {
  const float e = std::exp(-std::fabs(g));
  return g * ((g < 0.f ? e : 1.f) / (1.f + e));
}

inline float gelu_tanh1(float g) {
  const float a = 2.f * 0.7978845608028654f * (g + 0.044715f * (g * g * g));
  const float e = std::exp(-std::fabs(a));
  return g * ((a < 0.f ? e : 1.f) / (1.f + e));
}

// GELU: gelu_tanh(gate) * up; else silu(gate) * up.
template <typename T, bool GELU>
void act_rows(const T* gu, T* y, int64_t rows, int64_t n) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = gu + r * 2 * n;
      const T* u = g + n;
      T* yr = y + r * n;
#if defined(RADIXKV_AVX512)
      for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = lanes(n - i);
        const __m512 gv = load16m(g + i, m);
        const __m512 s = round16<T>(GELU ? gelu_tanh16(gv) : silu16(gv));
        store16m(yr + i, _mm512_mul_ps(s, load16m(u + i, m)), m);
      }
#else
      for (int64_t i = 0; i < n; ++i) {
        const float a = GELU ? gelu_tanh1(to_f(g[i])) : silu1(to_f(g[i]));
        yr[i] = from_f<T>(round_to<T>(a) * to_f(u[i]));
      }
#endif
    }
  });
}

// x [T, H, D] (rows of H heads, heads D apart, tokens x_row apart), cos/sin [T, D] (halves
// equal) -> y [T, H, D] contiguous.
template <typename T>
void rope_rows(const T* x, int64_t x_row, const T* cs, const T* sn, T* y, int64_t tokens,
               int64_t heads, int64_t d) {
  const int64_t half = d / 2;
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        const T* xr = x + t * x_row + h * d;
        T* yr = y + (t * heads + h) * d;
        const T* c = cs + t * d;
        const T* s = sn + t * d;
#if defined(RADIXKV_AVX512)
        for (int64_t i = 0; i < half; i += 16) {
          const __mmask16 m = lanes(half - i);
          const __m512 x1 = load16m(xr + i, m), x2 = load16m(xr + half + i, m);
          const __m512 cv = load16m(c + i, m), sv = load16m(s + i, m);
          store16m(yr + i, _mm512_sub_ps(_mm512_mul_ps(x1, cv), _mm512_mul_ps(x2, sv)), m);
          store16m(yr + half + i, _mm512_add_ps(_mm512_mul_ps(x2, cv), _mm512_mul_ps(x1, sv)), m);
        }
#else
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = to_f(xr[i]), x2 = to_f(xr[half + i]), cv = to_f(c[i]), sv = to_f(s[i]);
          const float a = x1 * cv, b = x2 * sv, e = x2 * cv, f = x1 * sv;
          yr[i] = from_f<T>(a - b);
          yr[half + i] = from_f<T>(e + f);
        }
#endif
      }
  });
}

#define RKV_DISPATCH(dtype, NAME, ...)                                              \
  switch (dtype) {                                                                \
    case torch::kFloat: { using scalar = float; __VA_ARGS__; break; }             \
    case torch::kBFloat16: { using scalar = c10::BFloat16; __VA_ARGS__; break; }  \
    case torch::kHalf: { using scalar = c10::Half; __VA_ARGS__; break; }          \
    default: TORCH_CHECK(false, NAME ": unsupported dtype ", dtype);              \
  }

}  // namespace

template <bool ONE_PLUS>
torch::Tensor rms_any(torch::Tensor x, torch::Tensor weight, double eps, const char* name) {
  const int64_t n = x.size(-1);
  TORCH_CHECK(weight.numel() == n && weight.scalar_type() == x.scalar_type(), name,
              ": weight must be [n] in x's dtype");
  x = x.contiguous();
  weight = weight.contiguous();
  auto y = torch::empty_like(x);
  const int64_t rows = n ? x.numel() / n : 0;
  RKV_DISPATCH(x.scalar_type(), "rms_norm",
               (rms_rows<scalar, ONE_PLUS>(x.data_ptr<scalar>(), weight.data_ptr<scalar>(),
                                           y.data_ptr<scalar>(), rows, n, static_cast<float>(eps))))
  return y;
}

template <bool GELU>
torch::Tensor act_mul(torch::Tensor gate_up, const char* name) {
  TORCH_CHECK(gate_up.size(-1) % 2 == 0, name, ": the last dim holds gate and up halves");
  gate_up = gate_up.contiguous();
  const int64_t n = gate_up.size(-1) / 2;
  auto sizes = gate_up.sizes().vec();
  sizes.back() = n;
  auto y = torch::empty(sizes, gate_up.options());
  const int64_t rows = n ? y.numel() / n : 0;
  RKV_DISPATCH(gate_up.scalar_type(), "act_mul",
               (act_rows<scalar, GELU>(gate_up.data_ptr<scalar>(), y.data_ptr<scalar>(), rows, n)))
  return y;
}

// x [..., n] (last dim contiguous rows), weight [n] -> [..., n] in x's dtype.
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  return rms_any<false>(x, weight, eps, "rms_norm");
}

// The same statistics, times (1 + weight) in f32 (Gemma 3, Qwen3.5).
torch::Tensor rms_norm_1p(torch::Tensor x, torch::Tensor weight, double eps) {
  return rms_any<true>(x, weight, eps, "rms_norm_1p");
}

// gate_up [..., 2n] (gate then up) -> silu(gate) * up [..., n].
torch::Tensor silu_mul(torch::Tensor gate_up) { return act_mul<false>(gate_up, "silu_mul"); }

// gate_up [..., 2n] -> gelu_tanh(gate) * up [..., n] (Gemma 3's gelu_pytorch_tanh).
torch::Tensor gelu_tanh_mul(torch::Tensor gate_up) {
  return act_mul<true>(gate_up, "gelu_tanh_mul");
}

// x [T, H, D] (heads and head dim contiguous; tokens any stride), cos/sin [T, D] -> [T, H, D].
torch::Tensor rope(torch::Tensor x, torch::Tensor cos, torch::Tensor sin) {
  TORCH_CHECK(x.dim() == 3 && cos.dim() == 2 && sin.sizes() == cos.sizes(), "rope: bad shapes");
  const int64_t t = x.size(0), h = x.size(1), d = x.size(2);
  TORCH_CHECK(cos.size(0) == t && cos.size(1) == d && d % 2 == 0, "rope: cos/sin must be [T, D]");
  TORCH_CHECK(cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type(),
              "rope: cos/sin must be in x's dtype");
  if (x.stride(2) != 1 || x.stride(1) != d) x = x.contiguous();
  cos = cos.contiguous();
  sin = sin.contiguous();
  auto y = torch::empty({t, h, d}, x.options());
  RKV_DISPATCH(x.scalar_type(), "rope",
               rope_rows<scalar>(x.data_ptr<scalar>(), x.stride(0), cos.data_ptr<scalar>(),
                                 sin.data_ptr<scalar>(), y.data_ptr<scalar>(), t, h, d))
  return y;
}

// The gated delta rule (gated DeltaNet: Qwen3.5, Qwen3-Next) token by token, with one fixed
// arithmetic per token whatever the run it is in: a prompt, a prefill chunk of any size, a decode
// step beside other requests, or a run continuing a forked checkpoint. So a token's output and the
// state after it are the same bits on every one of those paths, at any thread count.
//
// Per value head h (key head h / (Hv / Hk), as repeat_interleave shares them), state S [dk, dv]
// float32, token t:
//   q, k   <- x / sqrt(sum x^2 + 1e-6) (sum: 16 f32 lanes over the row, then the fixed tree of
//             _mm512_reduce_add_ps), q then times `scale`;
//   S      <- exp(g_t) * S                          (one multiply per element)
//   pred_j  = sum_i S[i][j] k[i]                    (one FMA chain over i = 0 .. dk-1, from 0)
//   u_j     = beta_t * (v_j - pred_j)
//   S[i][j] = fma(k[i], u_j, S[i][j])
//   o_j     = sum_i S[i][j] q[i]                    (one FMA chain over i = 0 .. dk-1, from 0)
// Every value of column j depends only on column j of S and the token's scalars, so a work item is
// (run, value head, a group of up to 32 columns): items never share an element, and how many run
// at once or on which thread changes nothing. A run's tokens are walked in order with the state in
// place in the pool; the update of token t and the decay / prediction of token t+1 share one pass
// over S (the same operations on the same values as two passes, one load and store fewer).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "simd.h"

namespace {

using namespace radixkv_simd;

// Columns per work item (2 vectors of 16): the item's block of S (dk x 32 floats, 16 KB at dk 128)
// stays in a 32 KB L1 beside the token's rows; 64 columns measured slower (docs/determinism.md).
constexpr int64_t kGroup = 32;
constexpr float kNormEps = 1e-6f;

struct Rule {
  const float* q;  // [T, Hk, dk] normalised and scaled
  const float* k;  // [T, Hk, dk] normalised
  const float* g;  // [T, Hv]
  const float* beta;
  float* state;  // [slots, Hv, dk, dv]
  float* out;    // [T, Hv, dv]
  int64_t v_tok;  // v's token stride (elements); heads and columns contiguous
  int64_t hk, hv, dk, dv;
};

struct Item {
  int64_t start, len, slot, head, col;
  bool fresh;
};

#if defined(RADIXKV_AVX512)
template <bool FULL>
inline __m512 ld(const float* p, __mmask16 m) {
  if constexpr (FULL) return _mm512_loadu_ps(p);
  else return _mm512_maskz_loadu_ps(m, p);
}
template <bool FULL>
inline void st(float* p, __m512 x, __mmask16 m) {
  if constexpr (FULL) _mm512_storeu_ps(p, x);
  else _mm512_mask_storeu_ps(p, m, x);
}
template <bool FULL, typename T>
inline __m512 ldv(const T* p, __mmask16 m) {
  if constexpr (FULL || std::is_same_v<T, float>) {
    if constexpr (FULL) return load16(p);
    else return _mm512_maskz_loadu_ps(m, p);
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
}

// One item: NV vectors of columns [col, col + 16 NV) of head `head` over the run's tokens.
template <typename T, int NV, bool FULL>
void run_item(const Rule& a, const T* v, const Item& it) {
  const int64_t dk = a.dk, dv = a.dv, h = it.head, qk_tok = a.hk * dk;
  float* S = a.state + (it.slot * a.hv + h) * dk * dv + it.col;
  __mmask16 m[NV];
  for (int j = 0; j < NV; ++j) m[j] = lanes(dv - it.col - 16 * j);
  const int64_t kh = h / (a.hv / a.hk);
  const float* q = a.q + it.start * qk_tok + kh * dk;
  const float* k = a.k + it.start * qk_tok + kh * dk;
  if (it.fresh)
    for (int64_t i = 0; i < dk; ++i)
      for (int j = 0; j < NV; ++j) st<FULL>(S + i * dv + 16 * j, _mm512_setzero_ps(), m[j]);
  __m512 pred[NV];
  {  // the first token's decay and prediction (later tokens': in the previous token's pass)
    const __m512 dec = _mm512_set1_ps(std::exp(a.g[it.start * a.hv + h]));
    for (int j = 0; j < NV; ++j) pred[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < dk; ++i) {
      const __m512 ki = _mm512_set1_ps(k[i]);
      for (int j = 0; j < NV; ++j) {
        float* row = S + i * dv + 16 * j;
        const __m512 s = _mm512_mul_ps(dec, ld<FULL>(row, m[j]));
        st<FULL>(row, s, m[j]);
        pred[j] = _mm512_fmadd_ps(s, ki, pred[j]);
      }
    }
  }
  for (int64_t t = 0; t < it.len; ++t) {
    const int64_t tok = it.start + t;
    const float* qt = q + t * qk_tok;
    const float* kt = k + t * qk_tok;
    const T* vt = v + tok * a.v_tok + h * dv + it.col;
    const __m512 bt = _mm512_set1_ps(a.beta[tok * a.hv + h]);
    __m512 u[NV], o[NV];
    for (int j = 0; j < NV; ++j) {
      u[j] = _mm512_mul_ps(bt, _mm512_sub_ps(ldv<FULL>(vt + 16 * j, m[j]), pred[j]));
      o[j] = _mm512_setzero_ps();
    }
    if (t + 1 < it.len) {
      const __m512 dec = _mm512_set1_ps(std::exp(a.g[(tok + 1) * a.hv + h]));
      const float* kn = kt + qk_tok;
      for (int j = 0; j < NV; ++j) pred[j] = _mm512_setzero_ps();
      for (int64_t i = 0; i < dk; ++i) {
        const __m512 qi = _mm512_set1_ps(qt[i]), ki = _mm512_set1_ps(kt[i]);
        const __m512 kni = _mm512_set1_ps(kn[i]);
        for (int j = 0; j < NV; ++j) {
          float* row = S + i * dv + 16 * j;
          __m512 s = _mm512_fmadd_ps(ki, u[j], ld<FULL>(row, m[j]));
          o[j] = _mm512_fmadd_ps(qi, s, o[j]);
          s = _mm512_mul_ps(dec, s);  // token t+1's decay
          st<FULL>(row, s, m[j]);
          pred[j] = _mm512_fmadd_ps(s, kni, pred[j]);
        }
      }
    } else {
      for (int64_t i = 0; i < dk; ++i) {
        const __m512 qi = _mm512_set1_ps(qt[i]), ki = _mm512_set1_ps(kt[i]);
        for (int j = 0; j < NV; ++j) {
          float* row = S + i * dv + 16 * j;
          const __m512 s = _mm512_fmadd_ps(ki, u[j], ld<FULL>(row, m[j]));
          o[j] = _mm512_fmadd_ps(qi, s, o[j]);
          st<FULL>(row, s, m[j]);
        }
      }
    }
    float* ot = a.out + (tok * a.hv + h) * dv + it.col;
    for (int j = 0; j < NV; ++j) st<FULL>(ot + 16 * j, o[j], m[j]);
  }
}

template <typename T, bool FULL>
void run_vec(const Rule& a, const T* v, const Item& it) {
  switch (std::min<int64_t>(kGroup / 16, (a.dv - it.col + 15) / 16)) {
    case 1: return run_item<T, 1, FULL>(a, v, it);
    case 2: return run_item<T, 2, FULL>(a, v, it);
    case 3: return run_item<T, 3, FULL>(a, v, it);
    default: return run_item<T, 4, FULL>(a, v, it);
  }
}

// Row r of x (d elements) -> y: x / sqrt(sum x^2 + eps) * mult (mult == 1: no multiply).
template <typename T>
void l2_row(const T* x, float* y, int64_t d, float mult) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < d; i += 16) {
    const __m512 e = ldv<false>(x + i, lanes(d - i));
    acc = _mm512_fmadd_ps(e, e, acc);
  }
  const __m512 inv = _mm512_set1_ps(1.f / std::sqrt(_mm512_reduce_add_ps(acc) + kNormEps));
  for (int64_t i = 0; i < d; i += 16) {
    const __mmask16 m = lanes(d - i);
    __m512 e = _mm512_mul_ps(ldv<false>(x + i, m), inv);
    if (mult != 1.f) e = _mm512_mul_ps(e, _mm512_set1_ps(mult));
    _mm512_mask_storeu_ps(y + i, m, e);
  }
}
#else
// Without AVX2 / AVX-512: the same chains per column in scalar code (std::fma for every FMA).
template <typename T>
void run_scalar(const Rule& a, const T* v, const Item& it) {
  const int64_t dk = a.dk, dv = a.dv, h = it.head, qk_tok = a.hk * dk;
  const int64_t kh = h / (a.hv / a.hk), width = std::min<int64_t>(kGroup, dv - it.col);
  float* S = a.state + (it.slot * a.hv + h) * dk * dv + it.col;
  for (int64_t c = 0; c < width; ++c) {
    for (int64_t t = 0; t < it.len; ++t) {
      const int64_t tok = it.start + t;
      const float* qt = a.q + tok * qk_tok + kh * dk;
      const float* kt = a.k + tok * qk_tok + kh * dk;
      const float dec = std::exp(a.g[tok * a.hv + h]);
      float pred = 0.f, o = 0.f;
      for (int64_t i = 0; i < dk; ++i) {
        float& s = S[i * dv + c];
        if (it.fresh && t == 0) s = 0.f;
        s = dec * s;
        pred = std::fma(s, kt[i], pred);
      }
      const float vt = static_cast<float>(v[tok * a.v_tok + h * dv + it.col + c]);
      const float u = a.beta[tok * a.hv + h] * (vt - pred);
      for (int64_t i = 0; i < dk; ++i) {
        float& s = S[i * dv + c];
        s = std::fma(kt[i], u, s);
        o = std::fma(qt[i], s, o);
      }
      a.out[(tok * a.hv + h) * dv + it.col + c] = o;
    }
  }
}

template <typename T>
void l2_row(const T* x, float* y, int64_t d, float mult) {
  float ss = 0.f;
  for (int64_t i = 0; i < d; ++i) ss = std::fma(to_f(x[i]), to_f(x[i]), ss);
  const float inv = 1.f / std::sqrt(ss + kNormEps);
  for (int64_t i = 0; i < d; ++i) y[i] = mult != 1.f ? (to_f(x[i]) * inv) * mult : to_f(x[i]) * inv;
}
#endif

// x [T, H, d] (token stride x_tok) -> y [T, H, d] float32, row by row.
template <typename T>
void l2_rows(const T* x, int64_t x_tok, int64_t tokens, int64_t heads, int64_t d, float mult,
             float* y) {
  at::parallel_for(0, tokens * heads, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      l2_row(x + (r / heads) * x_tok + (r % heads) * d, y + r * d, d, mult);
  });
}

// Items longest run first, taken one at a time by each thread (an atomic counter).
template <typename T>
void run_items(const Rule& a, const T* v, const std::vector<Item>& items) {
  std::atomic<int64_t> next{0};
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n));
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w)
      for (int64_t i = next++; i < n; i = next++) {
#if defined(RADIXKV_AVX512)
        if (a.dv % 16 == 0) run_vec<T, true>(a, v, items[i]);
        else run_vec<T, false>(a, v, items[i]);
#else
        run_scalar<T>(a, v, items[i]);
#endif
      }
  });
}

std::vector<Item> make_items(const torch::Tensor& starts, const torch::Tensor& lens,
                             const torch::Tensor& slots, const torch::Tensor& fresh, int64_t tokens,
                             int64_t num_slots, int64_t hv, int64_t dv) {
  const int64_t runs = starts.size(0);
  const int64_t* st = starts.data_ptr<int64_t>();
  const int64_t* ln = lens.data_ptr<int64_t>();
  const int64_t* sl = slots.data_ptr<int64_t>();
  const int64_t* fr = fresh.data_ptr<int64_t>();
  std::vector<bool> seen(num_slots, false);
  std::vector<int64_t> order(runs);
  for (int64_t r = 0; r < runs; ++r) {
    TORCH_CHECK(ln[r] >= 1 && st[r] >= 0 && st[r] + ln[r] <= tokens, "gated_delta_rule: run ", r,
                " is outside the tokens");
    TORCH_CHECK(sl[r] >= 0 && sl[r] < num_slots, "gated_delta_rule: slot ", sl[r], " out of range");
    TORCH_CHECK(!seen[sl[r]], "gated_delta_rule: two runs share state slot ", sl[r]);
    seen[sl[r]] = true;
    order[r] = r;
  }
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return ln[x] > ln[y]; });
  std::vector<Item> items;
  items.reserve(runs * hv * ((dv + kGroup - 1) / kGroup));
  for (int64_t r : order)
    for (int64_t h = 0; h < hv; ++h)
      for (int64_t c = 0; c < dv; c += kGroup) items.push_back({st[r], ln[r], sl[r], h, c, fr[r] != 0});
  return items;
}

#define RKV_DN_DISPATCH(dtype, ...)                                                 \
  switch (dtype) {                                                                \
    case torch::kFloat: { using scalar = float; __VA_ARGS__; break; }             \
    case torch::kBFloat16: { using scalar = c10::BFloat16; __VA_ARGS__; break; }  \
    case torch::kHalf: { using scalar = c10::Half; __VA_ARGS__; break; }          \
    default: TORCH_CHECK(false, "gated_delta_rule: unsupported dtype ", dtype);   \
  }

bool rows_contiguous(const torch::Tensor& x) {
  return x.dim() == 3 && x.stride(2) == 1 && x.stride(1) == x.size(2);
}

}  // namespace

// q, k [T, Hk, dk], v [T, Hv, dv] (one dtype; heads and dims contiguous, any token stride), g, beta
// [T, Hv] float32, state [slots, Hv, dk, dv] float32 (updated in place); run r is the tokens
// [starts[r], starts[r] + lens[r]) of one sequence, continuing slot slots[r] (zeros if fresh[r]).
// Returns o [T, Hv, dv] float32 (rows outside every run are left unset).
torch::Tensor gated_delta_rule(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor g,
                               torch::Tensor beta, torch::Tensor state, torch::Tensor starts,
                               torch::Tensor lens, torch::Tensor slots, torch::Tensor fresh,
                               double scale) {
  TORCH_CHECK(rows_contiguous(q) && rows_contiguous(k) && rows_contiguous(v),
              "gated_delta_rule: q, k, v must be [T, heads, dim] with heads and dim contiguous");
  TORCH_CHECK(q.sizes() == k.sizes() && q.scalar_type() == k.scalar_type() &&
                  v.scalar_type() == q.scalar_type(),
              "gated_delta_rule: q, k must match, v take their dtype");
  const int64_t T = q.size(0), hk = q.size(1), dk = q.size(2), hv = v.size(1), dv = v.size(2);
  TORCH_CHECK(v.size(0) == T && hk > 0 && hv % hk == 0, "gated_delta_rule: Hv must be a multiple of Hk");
  TORCH_CHECK(state.scalar_type() == torch::kFloat && state.is_contiguous() && state.dim() == 4 &&
                  state.size(1) == hv && state.size(2) == dk && state.size(3) == dv,
              "gated_delta_rule: state must be contiguous float32 [slots, Hv, dk, dv]");
  g = g.to(torch::kFloat).contiguous();
  beta = beta.to(torch::kFloat).contiguous();
  TORCH_CHECK(g.dim() == 2 && g.size(0) == T && g.size(1) == hv && beta.sizes() == g.sizes(),
              "gated_delta_rule: g, beta must be [T, Hv]");
  const auto i64 = [](const torch::Tensor& x) { return x.to(torch::kLong).contiguous(); };
  starts = i64(starts);
  lens = i64(lens);
  slots = i64(slots);
  fresh = i64(fresh);
  TORCH_CHECK(lens.sizes() == starts.sizes() && slots.sizes() == starts.sizes() &&
                  fresh.sizes() == starts.sizes() && starts.dim() == 1,
              "gated_delta_rule: starts, lens, slots, fresh must be [R]");
  const auto items = make_items(starts, lens, slots, fresh, T, state.size(0), hv, dv);
  auto opts = q.options().dtype(torch::kFloat);
  auto qn = torch::empty({T, hk, dk}, opts), kn = torch::empty({T, hk, dk}, opts);
  auto out = torch::empty({T, hv, dv}, opts);
  RKV_DN_DISPATCH(q.scalar_type(), {
    l2_rows<scalar>(q.data_ptr<scalar>(), q.stride(0), T, hk, dk, static_cast<float>(scale),
                    qn.data_ptr<float>());
    l2_rows<scalar>(k.data_ptr<scalar>(), k.stride(0), T, hk, dk, 1.f, kn.data_ptr<float>());
    const Rule a{qn.data_ptr<float>(), kn.data_ptr<float>(), g.data_ptr<float>(),
                 beta.data_ptr<float>(), state.data_ptr<float>(), out.data_ptr<float>(),
                 v.stride(0), hk, hv, dk, dv};
    run_items<scalar>(a, v.data_ptr<scalar>(), items);
  })
  return out;
}

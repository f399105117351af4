// Decode attention over a slot-indexed KV pool, for CPU: one query token per request attends to
// its context's K/V rows read in place from the pool (no gather copy), f32 scores, softmax and
// accumulation. One work item per request (or per (request, KV head) when requests are fewer than
// threads): the G query heads of a KV head share every K/V row loaded (grouped-query attention
// without repeating K/V). Two passes over the context: scores (K rows), then the
// softmax-weighted sum (V rows); each row is read once per pass, prefetched a few tokens ahead.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "simd.h"

namespace {

using namespace radixkv_simd;

#if defined(__AVX512F__)
template <typename T>
inline float dot(const float* q, const T* k, int64_t d) {
  if (d % 16 != 0) {
    float s = 0.f;
    for (int64_t i = 0; i < d; ++i) s += q[i] * to_f(k[i]);
    return s;
  }
  __m512 a = _mm512_setzero_ps();
  for (int64_t i = 0; i < d; i += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), load16(k + i), a);
  return _mm512_reduce_add_ps(a);
}
template <typename T>
inline void axpy(float w, const T* v, float* acc, int64_t d) {
  if (d % 16 != 0) {
    for (int64_t i = 0; i < d; ++i) acc[i] += w * to_f(v[i]);
    return;
  }
  const __m512 ww = _mm512_set1_ps(w);
  for (int64_t i = 0; i < d; i += 16)
    _mm512_storeu_ps(acc + i, _mm512_fmadd_ps(ww, load16(v + i), _mm512_loadu_ps(acc + i)));
}

// In-place softmax of s[0, n), 16 lanes at a time (the tail under a mask).
inline void softmax(float* s, int64_t n) {
  __m512 mv = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t t = 0; t < n; t += 16) {
    const __mmask16 live = lanes(n - t);
    mv = _mm512_mask_max_ps(mv, live, mv, _mm512_maskz_loadu_ps(live, s + t));
  }
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; t += 16) {
    const __mmask16 live = lanes(n - t);
    const __m512 e = exp_neg(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, s + t), m));
    sum = _mm512_mask_add_ps(sum, live, sum, e);
    _mm512_mask_storeu_ps(s + t, live, e);
  }
  const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(sum));
  for (int64_t t = 0; t < n; t += 16) {
    const __mmask16 live = lanes(n - t);
    _mm512_mask_storeu_ps(s + t, live, _mm512_mul_ps(_mm512_maskz_loadu_ps(live, s + t), inv));
  }
}
#else
inline void softmax(float* s, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < n; ++t) m = std::max(m, s[t]);
  float sum = 0.f;
  for (int64_t t = 0; t < n; ++t) {
    s[t] = std::exp(s[t] - m);
    sum += s[t];
  }
  const float inv = 1.f / sum;
  for (int64_t t = 0; t < n; ++t) s[t] *= inv;
}
template <typename T>
inline float dot(const float* q, const T* k, int64_t d) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < d; ++i) s += q[i] * to_f(k[i]);
  return s;
}

template <typename T>
inline void axpy(float a, const T* v, float* acc, int64_t d) {
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) acc[i] += a * to_f(v[i]);
}

#endif

// Prefetch one pool row (the KV heads [h0, h1) of a slot) a few tokens ahead: the context's rows
// are scattered, so the hardware prefetcher cannot guess the next one.
template <typename T>
inline void prefetch_row(const T* row, int64_t bytes) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 1);
}

constexpr int64_t kAhead = 12;  // tokens of prefetch distance

// One request's heads [h0, h1): pass 1 reads K rows into f32 scores, then a softmax per query head,
// pass 2 accumulates the V rows weighted by it. `qf`, `acc` hold (h1 - h0) * G * D floats, `sc`
// (h1 - h0) * G * W.
template <typename T>
void attend_one(const T* qp, const T* kp, const T* vp, T* op, const int64_t* rs, int64_t n,
                int64_t h0, int64_t h1, int64_t G, int64_t D, int64_t W, int64_t k_row,
                int64_t v_row, int64_t k_head, int64_t v_head, float scale, float* qf,
                float* acc, float* sc) {
  const int64_t nh = (h1 - h0) * G;  // query heads handled here
  for (int64_t j = 0; j < nh; ++j)
    for (int64_t i = 0; i < D; ++i) qf[j * D + i] = to_f(qp[(h0 * G + j) * D + i]) * scale;
  const int64_t span = ((h1 - h0 - 1) * k_head + D) * static_cast<int64_t>(sizeof(T));
  for (int64_t t = 0; t < n; ++t) {
    if (t + kAhead < n) prefetch_row(kp + rs[t + kAhead] * k_row + h0 * k_head, span);
    const T* kr = kp + rs[t] * k_row;
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t j = (h - h0) * G + g;
        sc[j * W + t] = dot(qf + j * D, kr + h * k_head, D);
      }
  }
  for (int64_t j = 0; j < nh; ++j) softmax(sc + j * W, n);
  std::fill(acc, acc + nh * D, 0.f);
  const int64_t vspan = ((h1 - h0 - 1) * v_head + D) * static_cast<int64_t>(sizeof(T));
  for (int64_t t = 0; t < n; ++t) {
    if (t + kAhead < n) prefetch_row(vp + rs[t + kAhead] * v_row + h0 * v_head, vspan);
    const T* vr = vp + rs[t] * v_row;
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t j = (h - h0) * G + g;
        axpy(sc[j * W + t], vr + h * v_head, acc + j * D, D);
      }
  }
  for (int64_t j = 0; j < nh; ++j)
    for (int64_t i = 0; i < D; ++i) op[(h0 * G + j) * D + i] = static_cast<T>(acc[j * D + i]);
}

#if defined(__AVX512F__)
// Lane c of the result is the sum of the 16 lanes of x[c] (a transposing add tree: 45 shuffles and
// adds for 16 dot products, against ~10 each for a horizontal reduction per vector).
inline __m512 reduce16(const __m512* x) {
  __m512 y[8], z[4];
  for (int i = 0; i < 8; ++i)
    y[i] = _mm512_add_ps(_mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]),
                         _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(y[2 * i]), b = _mm512_castps_pd(y[2 * i + 1]);
    z[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  const __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(z[2], z[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(z[2], z[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(w0, w1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Pass 1 of the vector path: scores of heads [h0, h1) x G against the context's K rows, 16 keys
// at a time (their rows stay in L1 while every query head of the block uses them; bf16 / f16
// rows are widened once into `kb`).
template <typename T, int ND>
void scores_fast(const float* qf, const T* kp, const int64_t* rs, int64_t n, int64_t h0,
                 int64_t h1, int64_t G, int64_t k_row, int64_t k_head, int64_t W, float* sc,
                 float* kb) {
  constexpr int64_t D = ND * 16;
  const int64_t nh = h1 - h0;
  const int64_t span = ((nh - 1) * k_head + D) * static_cast<int64_t>(sizeof(T));
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    const int64_t nb = std::min<int64_t>(16, n - t0);
    for (int64_t c = 16; c < 32 && t0 + c < n; ++c)
      prefetch_row(kp + rs[t0 + c] * k_row + h0 * k_head, span);
    const float* rows[16];
    int64_t hs = k_head;  // distance between two heads of one row, in floats
    if constexpr (std::is_same_v<T, float>) {
      for (int64_t c = 0; c < 16; ++c) rows[c] = kp + rs[t0 + std::min(c, nb - 1)] * k_row + h0 * k_head;
    } else {
      hs = D;
      for (int64_t c = 0; c < nb; ++c) {
        const T* src = kp + rs[t0 + c] * k_row + h0 * k_head;
        for (int64_t h = 0; h < nh; ++h)
          for (int i = 0; i < ND; ++i)
            _mm512_storeu_ps(kb + (c * nh + h) * D + i * 16, load16(src + h * k_head + i * 16));
        rows[c] = kb + c * nh * D;
      }
      for (int64_t c = nb; c < 16; ++c) rows[c] = rows[0];
    }
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t j = h * G + g;
        __m512 acc[16];
        for (int c = 0; c < 16; ++c) acc[c] = _mm512_setzero_ps();
        for (int i = 0; i < ND; ++i) {
          const __m512 qv = _mm512_loadu_ps(qf + j * D + i * 16);
          for (int c = 0; c < 16; ++c)
            acc[c] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(rows[c] + h * hs + i * 16), acc[c]);
        }
        _mm512_mask_storeu_ps(sc + j * W + t0, lanes(nb), reduce16(acc));
      }
  }
}

// Pass 2: out[j] = sum_t sc[j][t] V_t for GT query heads j0.. of KV head h, accumulated in
// registers over the whole context.
template <typename T, int ND, int GT>
void values_fast(const float* sc, const T* vp, const int64_t* rs, int64_t n, int64_t h,
                 int64_t j0, int64_t v_row, int64_t v_head, int64_t W, float* acc_out) {
  constexpr int64_t D = ND * 16;
  __m512 acc[GT][ND];
  for (int g = 0; g < GT; ++g)
    for (int i = 0; i < ND; ++i) acc[g][i] = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; ++t) {
    if (t + kAhead < n) prefetch_row(vp + rs[t + kAhead] * v_row + h * v_head, D * sizeof(T));
    const T* vr = vp + rs[t] * v_row + h * v_head;
    __m512 w[GT];
    for (int g = 0; g < GT; ++g) w[g] = _mm512_set1_ps(sc[(j0 + g) * W + t]);
    for (int i = 0; i < ND; ++i) {
      const __m512 vv = load16(vr + i * 16);
      for (int g = 0; g < GT; ++g) acc[g][i] = _mm512_fmadd_ps(w[g], vv, acc[g][i]);
    }
  }
  for (int g = 0; g < GT; ++g)
    for (int i = 0; i < ND; ++i) _mm512_storeu_ps(acc_out + (j0 + g) * D + i * 16, acc[g][i]);
}

// attend_one for D = 16 * ND on AVX-512 (same contract; `acc` holds the f32 outputs, `kb` 16
// widened K rows).
template <typename T, int ND>
void attend_one_fast(const T* qp, const T* kp, const T* vp, T* op, const int64_t* rs, int64_t n,
                     int64_t h0, int64_t h1, int64_t G, int64_t W, int64_t k_row, int64_t v_row,
                     int64_t k_head, int64_t v_head, float scale, float* qf, float* acc, float* sc,
                     float* kb) {
  constexpr int64_t D = ND * 16;
  constexpr int GT = ND >= 16 ? 1 : (ND >= 8 ? 2 : 4);  // GT x ND accumulators <= 16
  const int64_t nh = (h1 - h0) * G;
  for (int64_t j = 0; j < nh; ++j)
    for (int64_t i = 0; i < D; ++i) qf[j * D + i] = to_f(qp[(h0 * G + j) * D + i]) * scale;
  scores_fast<T, ND>(qf, kp, rs, n, h0, h1, G, k_row, k_head, W, sc, kb);
  for (int64_t j = 0; j < nh; ++j) softmax(sc + j * W, n);
  for (int64_t h = h0; h < h1; ++h)
    for (int64_t g = 0; g < G; g += GT) {
      const int64_t j0 = (h - h0) * G + g;
      switch (std::min<int64_t>(GT, G - g)) {
        case 1: values_fast<T, ND, 1>(sc, vp, rs, n, h, j0, v_row, v_head, W, acc); break;
        case 2: values_fast<T, ND, (GT >= 2 ? 2 : 1)>(sc, vp, rs, n, h, j0, v_row, v_head, W, acc); break;
        case 3: values_fast<T, ND, (GT >= 3 ? 3 : 1)>(sc, vp, rs, n, h, j0, v_row, v_head, W, acc); break;
        default: values_fast<T, ND, GT>(sc, vp, rs, n, h, j0, v_row, v_head, W, acc); break;
      }
    }
  for (int64_t j = 0; j < nh; ++j)
    for (int64_t i = 0; i < D; ++i) op[(h0 * G + j) * D + i] = static_cast<T>(acc[j * D + i]);
}
#endif

template <typename T>
void run(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
         const torch::Tensor& slots, const torch::Tensor& lens, torch::Tensor& out, double scale) {
  const int64_t R = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t KV = k.size(1), G = H / KV, W = slots.size(1);
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  // A work item is a whole request (its rows are read front to back, all KV heads at once) unless
  // there are fewer requests than threads; then it is one (request, KV head).
  const int64_t per = R < at::get_num_threads() ? 1 : KV;
  const int64_t items = R * (KV / per);
  at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(per * G * D), acc(per * G * D), sc(per * G * W), kb(16 * per * D);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r = item / (KV / per), h0 = (item % (KV / per)) * per;
      const T* qr = qp + r * H * D;
      T* orow = op + r * H * D;
      const int64_t* rs = sp + r * W;
      const float sf = static_cast<float>(scale);
#if defined(__AVX512F__)
#define RADIXKV_FAST(ND)                                                                      \
  attend_one_fast<T, ND>(qr, kp, vp, orow, rs, lp[r], h0, h0 + per, G, W, k.stride(0),        \
                         v.stride(0), k.stride(1), v.stride(1), sf, qf.data(), acc.data(),    \
                         sc.data(), kb.data())
      switch (D) {
        case 16: RADIXKV_FAST(1); continue;
        case 32: RADIXKV_FAST(2); continue;
        case 64: RADIXKV_FAST(4); continue;
        case 128: RADIXKV_FAST(8); continue;
        case 256: RADIXKV_FAST(16); continue;
        default: break;
      }
#undef RADIXKV_FAST
#endif
      attend_one(qr, kp, vp, orow, rs, lp[r], h0, h0 + per, G, D, W, k.stride(0), v.stride(0),
                 k.stride(1), v.stride(1), sf, qf.data(), acc.data(), sc.data());
    }
  });
}

}  // namespace

// q [R, H, D] contiguous; k, v [N, KV, D] (rows addressed by slot, last dim contiguous);
// slots [R, W] int64 (row r's first lens[r] entries are its context); lens [R] int64 >= 1.
torch::Tensor decode_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                               torch::Tensor slots, torch::Tensor lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "q, k, v must be 3-D");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(),
              "q, k, v dtypes differ");
  TORCH_CHECK(k.stride(2) == 1 && v.stride(2) == 1, "k, v rows must be contiguous");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(slots.scalar_type() == torch::kLong && lens.scalar_type() == torch::kLong,
              "slots and lens must be int64");
  q = q.contiguous();
  slots = slots.contiguous();
  lens = lens.contiguous();
  auto out = torch::empty_like(q);
  switch (q.scalar_type()) {
    case torch::kFloat: run<float>(q, k, v, slots, lens, out, scale); break;
    case torch::kBFloat16: run<c10::BFloat16>(q, k, v, slots, lens, out, scale); break;
    case torch::kHalf: run<c10::Half>(q, k, v, slots, lens, out, scale); break;
    default: TORCH_CHECK(false, "unsupported dtype ", q.scalar_type());
  }
  return out;
}

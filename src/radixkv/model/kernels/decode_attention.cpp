// Decode attention over a slot-indexed KV pool, for CPU: one query token per request attends to
// its context's K/V rows read in place from the pool (no gather copy). On AVX-512 with a head dim
// that is a multiple of 16 (up to 256) it sums in the extend kernel's order (decode_canon.h), so a
// decode step and a prefill chunk give the same bits for the same token; work items are (request,
// one or more KV heads: as many as still split evenly over the threads), longest context first,
// and the G query heads of a KV head share every K/V row loaded.
// Elsewhere a scalar two-pass loop serves (scores, softmax, weighted sum), without that promise.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "attn_amx.h"
#include "decode_canon.h"
#include "simd.h"

namespace {

using namespace radixkv_simd;

#if defined(RADIXKV_AVX512)
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

// Runs fn(r, h, nh, g0, gn, scratch) for every item (request r, KV heads [h, h + nh), query
// heads [g0, g0 + gn) of each in chunks of `chunk`), longest context first, taken from a shared
// counter so that unequal contexts balance across threads; each thread makes its scratch once,
// with make(). With `heads` > 1 (a divisor of KV, heads * G <= chunk) an item is `heads` KV
// heads of a request with all their query heads: each key's row is then read in wider
// contiguous runs (the whole row when heads == KV) instead of a head's slice per item.
template <typename Make, typename Fn>
void for_each_item(int64_t R, int64_t KV, int64_t G, int64_t chunk, const int64_t* lens,
                   int64_t heads, const Make& make, const Fn& fn) {
  const int64_t chunks = heads > 1 ? 1 : (G + chunk - 1) / chunk;
  const int64_t per_r = KV / heads * chunks;
  std::vector<int64_t> order(R * per_r);
  for (int64_t i = 0; i < static_cast<int64_t>(order.size()); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return lens[a / per_r] > lens[b / per_r];
  });
  std::atomic<int64_t> next{0};
  const int64_t n = static_cast<int64_t>(order.size());
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), n);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      auto w = make();
      for (int64_t i = next++; i < n; i = next++) {
        const int64_t item = order[i], r = item / per_r;
        if (heads > 1) {
          fn(r, (item % per_r) * heads, heads, 0, G, *w);
          continue;
        }
        const int64_t h = (item / chunks) % KV, g0 = (item % chunks) * chunk;
        fn(r, h, 1, g0, std::min<int64_t>(chunk, G - g0), *w);
      }
    }
  });
}

// KV heads per item: the most (a divisor of KV, with their query heads within `chunk`) that
// still give every thread work to the end: at least two items per thread and a count the
// threads divide, else one (a thread left idle at the end costs more than the narrower rows).
inline int64_t heads_per_item(int64_t R, int64_t KV, int64_t G, int64_t chunk, int64_t threads) {
  for (int64_t heads = KV; heads > 1; --heads) {
    if (KV % heads != 0 || heads * G > chunk) continue;
    const int64_t items = R * (KV / heads);
    if (items >= 2 * threads && items % threads == 0) return heads;
  }
  return 1;
}

#if defined(RADIXKV_AMX)
// bfloat16 on AMX (attn_amx.h, the extend kernel's path too): items are (request, KV head), the
// G query heads of the KV head as rows at the request's last position (chunks of 64 heads).
void run_amx(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
             const torch::Tensor& slots, const torch::Tensor& lens, torch::Tensor& out,
             int64_t window, float scale) {
  namespace amx = radixkv_attn_amx;
  using BF16 = c10::BFloat16;
  const int64_t R = q.size(0), H = q.size(1), D = q.size(2), KV = k.size(1), G = H / KV;
  const int64_t W = slots.size(1);
  const BF16* qp = q.data_ptr<BF16>();
  const BF16* kp = k.data_ptr<BF16>();
  const BF16* vp = v.data_ptr<BF16>();
  BF16* op = out.data_ptr<BF16>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  const amx::Geometry g{D, k.stride(0), k.stride(1), v.stride(0), v.stride(1), window, scale};
  auto make = [] { return std::make_unique<amx::TileThread>(); };
  for_each_item(R, KV, G, amx::kRows, lp, /*heads=*/1, make,
                [&](int64_t r, int64_t h, int64_t, int64_t g0, int64_t gn, amx::TileThread& tt) {
                  amx::Scratch& w = tt.w;
                  w.rows = gn;
                  for (int64_t j = 0; j < gn; ++j) {
                    w.pos[j] = lp[r] - 1;
                    w.set_query(j, qp + (r * H + h * G + g0 + j) * D, D);
                  }
                  amx::attend(g, kp, vp, sp + r * W, h, w);
                  for (int64_t j = 0; j < gn; ++j)
                    amx::store_row(w, j, D, op + (r * H + h * G + g0 + j) * D);
                });
}
#endif

// Items are (request, KV head, chunk of kMaxG query heads), see for_each_item.
template <typename T>
void run(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
         const torch::Tensor& slots, const torch::Tensor& lens, torch::Tensor& out, int64_t window,
         double scale) {
  const int64_t R = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t KV = k.size(1), G = H / KV, W = slots.size(1);
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  const float sf = static_cast<float>(scale);
#if defined(RADIXKV_AMX)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (D % 16 == 0 && D <= 256 && radixkv_amx::enabled()) {
      run_amx(q, k, v, slots, lens, out, window, sf);
      return;
    }
  }
#endif
#if defined(RADIXKV_AVX512)
  if (D % 16 == 0 && D <= 256) {
    using namespace radixkv_decode;
    const Problem P{H, KV, G, D, window, k.stride(0), v.stride(0), k.stride(1), v.stride(1), W,
                    sf, sp, lp};
    // Default-initialised (no 100 KB memset per call): every field is written before it is
    // read, and stale K words in unused lanes only reach masked scores.
    auto make = [] { return std::unique_ptr<Scratch>(new Scratch); };
    // Items of several KV heads read each key's row in wider runs, which the hardware
    // prefetchers follow (the 1B shape's 8 heads whole: about 2x per-head items at 8k keys).
    const int64_t heads = heads_per_item(R, KV, G, kMaxG, at::get_num_threads());
    // The values phase's width in vectors: the widest power of two up to 16 dividing D / 16 (it
    // runs D / (16 x width) passes).
    int64_t width = 16;
    while ((D / 16) % width != 0) width /= 2;
    for_each_item(R, KV, G, kMaxG, lp, heads, make,
                  [&](int64_t r, int64_t h, int64_t nh, int64_t g0, int64_t gn, Scratch& w) {
#define RKV_ITEM(WORDS, ND) decode_item<T, WORDS, ND>(P, qp, kp, vp, op, r, h, nh, g0, gn, w)
#define RKV_BY_ND(WORDS)               \
  switch (width) {                     \
    case 16: RKV_ITEM(WORDS, 16); break; \
    case 8: RKV_ITEM(WORDS, 8); break;   \
    case 4: RKV_ITEM(WORDS, 4); break;   \
    case 2: RKV_ITEM(WORDS, 2); break;   \
    default: RKV_ITEM(WORDS, 1); break;  \
  }
#if defined(__AVX512BF16__)
                    if constexpr (std::is_same_v<T, c10::BFloat16>) {
                      RKV_BY_ND(BF16Words)
                      return;
                    }
#endif
                    RKV_BY_ND(F32Words)
#undef RKV_BY_ND
#undef RKV_ITEM
                  });
    return;
  }
#endif
  at::parallel_for(0, R, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(KV * G * D), acc(KV * G * D), sc(KV * G * W);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = lp[r], lo = window > 0 ? std::max<int64_t>(0, n - window) : 0;
      attend_one(qp + r * H * D, kp, vp, op + r * H * D, sp + r * W + lo, n - lo, 0, KV, G, D, W,
                 k.stride(0), v.stride(0), k.stride(1), v.stride(1), sf, qf.data(), acc.data(),
                 sc.data());
    }
  });
}

}  // namespace

// q [R, H, D] contiguous; k, v [N, KV, D] (rows addressed by slot, last dim contiguous);
// slots [R, W] int64 (row r's first lens[r] entries are its whole context, position order);
// lens [R] int64 >= 1; window 0: none, else the query sees its last `window` positions.
torch::Tensor decode_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                               torch::Tensor slots, torch::Tensor lens, int64_t window,
                               double scale) {
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
    case torch::kFloat: run<float>(q, k, v, slots, lens, out, window, scale); break;
    case torch::kBFloat16: run<c10::BFloat16>(q, k, v, slots, lens, out, window, scale); break;
    case torch::kHalf: run<c10::Half>(q, k, v, slots, lens, out, window, scale); break;
    default: TORCH_CHECK(false, "unsupported dtype ", q.scalar_type());
  }
  return out;
}

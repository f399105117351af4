// Prefill / chunked-prefill ("extend") attention over a slot-indexed KV pool, for AVX-512 CPUs.
//
// Each request's e new queries (positions prefix .. prefix + e - 1) attend causally (optionally
// within a sliding window) to its context K/V, read from the pool by slot; f32 scores, online
// softmax and accumulation (flash-attention style: one pass over the keys, no L x L matrix).
//
// Work item = (request, KV head, block of query tokens): its rows are the block's tokens times
// the G query heads that share the KV head (grouped-query attention without repeating K/V), at
// most 64 rows. Everything is kept TRANSPOSED, rows in the vector lanes:
//   Q^T [D][rows]   scores S^T [keys][rows]   output O^T [D][rows],
// so the softmax's per-row max and sum are plain vertical vector ops, and the two products
// broadcast single K / V elements against 16 rows at a time (4 keys or 4 dims x 64 rows in 16
// accumulators). A block of 64 keys is first copied (and for bf16/f16 widened) from the pool into
// contiguous f32 rows. Items are taken from a shared counter, longest first, so the causal
// triangle's unequal items balance across threads.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <vector>

#include "simd.h"

#if defined(__AVX512F__)
namespace {

using namespace radixkv_simd;

constexpr int64_t kRows = 64;  // query rows per work item (4 vectors of 16)
constexpr int64_t kKeys = 64;  // keys per block
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// exp(x) for x <= 0 that is exactly 0 below -87 (masked keys carry -inf and must weigh nothing).
inline __m512 exp0(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  return _mm512_maskz_mov_ps(live, exp_neg(x));
}

// Pins a loaded vector in a register: without it GCC folds the load into each of the 4 FMAs
// that use it (4x the loads, and the loops become load-bound).
inline void keep(__m512& x) { asm volatile("" : "+v"(x)); }

struct Problem {
  int64_t H, KV, G, D, window;  // window 0: none
  int64_t q_row, k_row, v_row, k_head, v_head, o_row;  // strides in elements
  float scale;
  const int64_t* slots;      // concatenated contexts
  const int64_t* ctx_start;  // [R] offset of request r's context in `slots`
  const int64_t* q_start;    // [R] first row of request r in q / out
  const int64_t* new_len;    // [R] e
  const int64_t* prefix;     // [R] position of the first new token
};

struct Item {
  int64_t r, h, t0, t1, cost;
};

struct Scratch {
  std::vector<float> qt, kb, vb, st, ot, pos;
  explicit Scratch(int64_t D)
      : qt(D * kRows), kb(kKeys * D), vb(kKeys * D), st(kKeys * kRows), ot(D * kRows),
        pos(kRows) {}
};

// S^T[c][rows] = sum_d K[c][d] Q^T[d][rows] for keys [0, nk); RV vectors of rows.
template <int RV>
inline void scores(const float* qt, const float* kb, int64_t D, int64_t nk, float* st) {
  int64_t c = 0;
  for (; c + 4 <= nk; c += 4) {
    __m512 acc[4][RV];
    for (int i = 0; i < 4; ++i)
      for (int v = 0; v < RV; ++v) acc[i][v] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
      __m512 q[RV];
      for (int v = 0; v < RV; ++v) {
        q[v] = _mm512_loadu_ps(qt + d * kRows + v * 16);
        keep(q[v]);
      }
      for (int i = 0; i < 4; ++i) {
        const __m512 kv = _mm512_set1_ps(kb[(c + i) * D + d]);
        for (int v = 0; v < RV; ++v) acc[i][v] = _mm512_fmadd_ps(kv, q[v], acc[i][v]);
      }
    }
    for (int i = 0; i < 4; ++i)
      for (int v = 0; v < RV; ++v) _mm512_storeu_ps(st + (c + i) * kRows + v * 16, acc[i][v]);
  }
  for (; c < nk; ++c) {
    __m512 acc[RV];
    for (int v = 0; v < RV; ++v) acc[v] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
      const __m512 kv = _mm512_set1_ps(kb[c * D + d]);
      for (int v = 0; v < RV; ++v)
        acc[v] = _mm512_fmadd_ps(kv, _mm512_loadu_ps(qt + d * kRows + v * 16), acc[v]);
    }
    for (int v = 0; v < RV; ++v) _mm512_storeu_ps(st + c * kRows + v * 16, acc[v]);
  }
}

// O^T[d][rows] = alpha[rows] * O^T[d][rows] + sum_c V[c][d] P^T[c][rows].
template <int RV>
inline void accumulate(const float* pt, const float* vb, int64_t D, int64_t nk,
                       const __m512* alpha, float* ot) {
  for (int64_t d = 0; d < D; d += 4) {
    __m512 acc[4][RV];
    for (int i = 0; i < 4; ++i)
      for (int v = 0; v < RV; ++v)
        acc[i][v] = _mm512_mul_ps(_mm512_loadu_ps(ot + (d + i) * kRows + v * 16), alpha[v]);
    for (int64_t c = 0; c < nk; ++c) {
      __m512 p[RV];
      for (int v = 0; v < RV; ++v) {
        p[v] = _mm512_loadu_ps(pt + c * kRows + v * 16);
        keep(p[v]);
      }
      for (int i = 0; i < 4; ++i) {
        const __m512 vv = _mm512_set1_ps(vb[c * D + d + i]);
        for (int v = 0; v < RV; ++v) acc[i][v] = _mm512_fmadd_ps(vv, p[v], acc[i][v]);
      }
    }
    for (int i = 0; i < 4; ++i)
      for (int v = 0; v < RV; ++v) _mm512_storeu_ps(ot + (d + i) * kRows + v * 16, acc[i][v]);
  }
}

// Keys [kb0, kb0 + nk) of request r's context, KV head h, as contiguous f32 rows.
template <typename T>
inline void load_keys(const Problem& P, const T* k, const T* v, const int64_t* sl, int64_t kb0,
                      int64_t nk, int64_t h, float* kb, float* vb) {
  const int64_t D = P.D;
  for (int64_t c = 0; c < nk; ++c) {
    const T* kr = k + sl[kb0 + c] * P.k_row + h * P.k_head;
    const T* vr = v + sl[kb0 + c] * P.v_row + h * P.v_head;
    for (int64_t d = 0; d < D; d += 16) {
      _mm512_storeu_ps(kb + c * D + d, load16(kr + d));
      _mm512_storeu_ps(vb + c * D + d, load16(vr + d));
    }
  }
}

// Masks S^T of one key block: key position j is visible to a row at position p iff j <= p and,
// with a window W, j > p - W.
template <int RV>
inline void mask_block(const Problem& P, const float* pos, int64_t kb0, int64_t nk, float* st) {
  const __m512 neg = _mm512_set1_ps(kNegInf);
  for (int64_t c = 0; c < nk; ++c) {
    const __m512 j = _mm512_set1_ps(static_cast<float>(kb0 + c));
    for (int v = 0; v < RV; ++v) {
      const __m512 p = _mm512_loadu_ps(pos + v * 16);
      __mmask16 bad = _mm512_cmp_ps_mask(j, p, _CMP_GT_OQ);
      if (P.window > 0)
        bad |= _mm512_cmp_ps_mask(
            j, _mm512_sub_ps(p, _mm512_set1_ps(static_cast<float>(P.window))), _CMP_LE_OQ);
      _mm512_mask_storeu_ps(st + c * kRows + v * 16, bad, neg);
    }
  }
}

// Online softmax over one key block (in place: S^T becomes P^T); returns the rescale factors of
// the earlier accumulation in `alpha`. Rows with no visible key so far keep m = -inf, P = 0.
template <int RV>
inline void softmax_block(float* st, int64_t nk, float* m, float* l, __m512* alpha) {
  const __m512 neg = _mm512_set1_ps(kNegInf);
  for (int v = 0; v < RV; ++v) {
    __m512 bm = neg;
    for (int64_t c = 0; c < nk; ++c) bm = _mm512_max_ps(bm, _mm512_loadu_ps(st + c * kRows + v * 16));
    const __m512 m_old = _mm512_loadu_ps(m + v * 16);
    const __m512 m_new = _mm512_max_ps(m_old, bm);
    // -inf (nothing visible yet) is replaced by 0 so that -inf - m stays -inf, never NaN.
    const __m512 safe = _mm512_mask_mov_ps(m_new, _mm512_cmp_ps_mask(m_new, neg, _CMP_EQ_OQ),
                                           _mm512_setzero_ps());
    alpha[v] = exp0(_mm512_sub_ps(m_old, safe));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t c = 0; c < nk; ++c) {
      float* s = st + c * kRows + v * 16;
      const __m512 e = exp0(_mm512_sub_ps(_mm512_loadu_ps(s), safe));
      sum = _mm512_add_ps(sum, e);
      _mm512_storeu_ps(s, e);
    }
    _mm512_storeu_ps(l + v * 16, _mm512_fmadd_ps(_mm512_loadu_ps(l + v * 16), alpha[v], sum));
    _mm512_storeu_ps(m + v * 16, m_new);
  }
}

template <typename T, int RV>
void run_item(const Problem& P, const T* q, const T* k, const T* v, T* out, const Item& it,
              Scratch& w) {
  const int64_t G = P.G, D = P.D, nt = it.t1 - it.t0, rows = nt * G;
  const int64_t p0 = P.prefix[it.r] + it.t0, p1 = P.prefix[it.r] + it.t1 - 1;
  float* qt = w.qt.data();
  float* ot = w.ot.data();
  float* pos = w.pos.data();
  std::fill(qt, qt + D * kRows, 0.f);
  std::fill(ot, ot + D * kRows, 0.f);
  alignas(64) float m[kRows], l[kRows];
  std::fill(m, m + kRows, kNegInf);
  std::fill(l, l + kRows, 0.f);
  // Rows are (token, group head) pairs, token-major; padding rows sit at the last position.
  for (int64_t ri = 0; ri < RV * 16; ++ri)
    pos[ri] = static_cast<float>(ri < rows ? p0 + ri / G : p1);
  for (int64_t ri = 0; ri < rows; ++ri) {
    const T* src = q + (P.q_start[it.r] + it.t0 + ri / G) * P.q_row + (it.h * G + ri % G) * D;
    for (int64_t d = 0; d < D; ++d) qt[d * kRows + ri] = to_f(src[d]) * P.scale;
  }
  const int64_t lo = P.window > 0 ? std::max<int64_t>(0, p0 - P.window + 1) : 0;
  const int64_t* sl = P.slots + P.ctx_start[it.r];
  __m512 alpha[RV];
  for (int64_t kb0 = lo; kb0 <= p1; kb0 += kKeys) {
    const int64_t nk = std::min(kKeys, p1 + 1 - kb0);
    load_keys(P, k, v, sl, kb0, nk, it.h, w.kb.data(), w.vb.data());
    scores<RV>(qt, w.kb.data(), D, nk, w.st.data());
    // Every row sees the whole block unless it reaches the diagonal or the window's edge.
    const bool full = kb0 + nk - 1 <= p0 && (P.window == 0 || kb0 > p1 - P.window);
    if (!full) mask_block<RV>(P, pos, kb0, nk, w.st.data());
    softmax_block<RV>(w.st.data(), nk, m, l, alpha);
    accumulate<RV>(w.st.data(), w.vb.data(), D, nk, alpha, ot);
  }
  for (int64_t ri = 0; ri < rows; ++ri) {
    T* dst = out + (P.q_start[it.r] + it.t0 + ri / G) * P.o_row + (it.h * G + ri % G) * D;
    const float inv = 1.f / l[ri];
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(ot[d * kRows + ri] * inv);
  }
}

template <typename T>
void run(const Problem& P, const T* q, const T* k, const T* v, T* out, std::vector<Item>& items) {
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
  std::atomic<int64_t> next{0};
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), n);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      Scratch w(P.D);
      for (int64_t i = next++; i < n; i = next++) {
        const Item& it = items[i];
        switch (((it.t1 - it.t0) * P.G + 15) / 16) {
          case 1: run_item<T, 1>(P, q, k, v, out, it, w); break;
          case 2: run_item<T, 2>(P, q, k, v, out, it, w); break;
          case 3: run_item<T, 3>(P, q, k, v, out, it, w); break;
          default: run_item<T, 4>(P, q, k, v, out, it, w); break;
        }
      }
    }
  });
}

}  // namespace
#endif

bool extend_attention_supported() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

// q [T, H, D] (rows of every request's new tokens), k, v [N, KV, D] (rows by slot, last dim
// contiguous), slots: the requests' contexts concatenated (int64); per request r (int64 [R]):
// ctx_start (offset into slots), q_start (first row in q), new_len (e >= 1), prefix (position of
// its first new token; its context holds prefix + e slots). window 0: none. Returns [T, H, D].
torch::Tensor extend_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                               torch::Tensor slots, torch::Tensor ctx_start, torch::Tensor q_start,
                               torch::Tensor new_len, torch::Tensor prefix, int64_t window,
                               double scale) {
#if defined(__AVX512F__)
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "q, k, v must be 3-D");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(),
              "q, k, v dtypes differ");
  TORCH_CHECK(k.stride(2) == 1 && v.stride(2) == 1, "k, v rows must be contiguous");
  const int64_t H = q.size(1), D = q.size(2), KV = k.size(1);
  TORCH_CHECK(H % KV == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(D % 16 == 0 && D <= 256, "head_dim must be a multiple of 16, at most 256");
  for (const auto* t : {&slots, &ctx_start, &q_start, &new_len, &prefix})
    TORCH_CHECK(t->scalar_type() == torch::kLong && t->is_contiguous(), "index tensors: int64");
  if (q.stride(2) != 1 || q.stride(1) != D) q = q.contiguous();
  auto out = torch::empty({q.size(0), H, D}, q.options());
  Problem P{H, KV, H / KV, D, window, q.stride(0), k.stride(0), v.stride(0), k.stride(1),
            v.stride(1), out.stride(0), static_cast<float>(scale), slots.data_ptr<int64_t>(),
            ctx_start.data_ptr<int64_t>(), q_start.data_ptr<int64_t>(),
            new_len.data_ptr<int64_t>(), prefix.data_ptr<int64_t>()};
  const int64_t bt = std::max<int64_t>(1, kRows / P.G);  // query tokens per item
  std::vector<Item> items;
  for (int64_t r = 0; r < ctx_start.size(0); ++r) {
    const int64_t e = P.new_len[r];
    for (int64_t t0 = 0; t0 < e; t0 += bt) {
      const int64_t t1 = std::min(e, t0 + bt), last = P.prefix[r] + t1 - 1;
      const int64_t first = window > 0 ? std::max<int64_t>(0, P.prefix[r] + t0 - window + 1) : 0;
      for (int64_t h = 0; h < KV; ++h) items.push_back({r, h, t0, t1, (t1 - t0) * (last - first + 1)});
    }
  }
  switch (q.scalar_type()) {
    case torch::kFloat:
      run<float>(P, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                 out.data_ptr<float>(), items);
      break;
    case torch::kBFloat16:
      run<c10::BFloat16>(P, q.data_ptr<c10::BFloat16>(), k.data_ptr<c10::BFloat16>(),
                         v.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>(), items);
      break;
    case torch::kHalf:
      run<c10::Half>(P, q.data_ptr<c10::Half>(), k.data_ptr<c10::Half>(),
                     v.data_ptr<c10::Half>(), out.data_ptr<c10::Half>(), items);
      break;
    default: TORCH_CHECK(false, "unsupported dtype ", q.scalar_type());
  }
  return out;
#else
  TORCH_CHECK(false, "extend_attention needs AVX-512");
  return q;
#endif
}

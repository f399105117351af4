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
// triangle's unequal items balance across threads. On contexts of 1,024 keys or more an item
// holds up to four such sub-blocks of rows, which share each key block it loads (each K/V row
// leaves memory once per 4 x 64 rows, not once per 64): 7-9% less time for a bfloat16 prefill
// of 8k tokens on a Zen 4 core, the same bits (each row's arithmetic is its own).
// The products live in extend_f32.h (float32 FMAs, any dtype) and extend_bf16.h (VDPBF16PS on
// bf16 pools, where the CPU has AVX-512 BF16); the block loop, masks and softmax are shared
// (extend_common.h).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "attn_amx.h"
#include "extend_bf16.h"
#include "extend_common.h"
#include "extend_f32.h"

#if defined(RADIXKV_AVX512)
namespace {

using namespace radixkv_extend;

// out's rows of the item: O^T[d][row] * (1 / l[row]), rounded to T, 16 rows x 16 dims at a
// time through an in-register transpose.
template <typename T>
int64_t D_bytes(const Problem& P) {
  return P.D * static_cast<int64_t>(sizeof(T));
}

template <typename T>
void store_rows(const Problem& P, const Item& it, int64_t rows, const float* l, const float* ot,
                T* out) {
  const int64_t G = P.G, D = P.D;
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.f), _mm512_loadu_ps(l + r0));
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
      __m512 x[16];
      for (int t = 0; t < 16; ++t) x[t] = _mm512_mul_ps(_mm512_loadu_ps(ot + (d0 + t) * kRows + r0), inv);
      transpose16(x);  // x[i]: dims [d0, d0 + 16) of row r0 + i
      for (int64_t i = 0; i < 16 && r0 + i < rows; ++i) {
        const int64_t ri = r0 + i;
        T* dst = out + (P.q_start[it.r] + it.t0 + ri / G) * P.o_row + (it.h * G + ri % G) * D + d0;
        if constexpr (std::is_same_v<T, float>) {
          _mm512_storeu_ps(dst, x[i]);
        } else {
          alignas(64) float f[16];
          _mm512_store_ps(f, x[i]);
          for (int j = 0; j < 16; ++j) dst[j] = static_cast<T>(f[j]);
        }
      }
    }
  }
}

// One sub-block's rows: query tokens [t0, t1) at positions p0 .. p1, its first key block lo.
struct Rows {
  Item it;
  int64_t rows, p0, p1, lo;
};

template <typename T, typename Products>
Rows start_rows(const Problem& P, const T* q, const Item& it, int64_t g, int64_t rv, Scratch& w,
                float* m, float* l) {
  const Item s = sub_item(it, P.bt, g);
  const int64_t rows = (s.t1 - s.t0) * P.G;
  const int64_t p0 = P.prefix[s.r] + s.t0, p1 = P.prefix[s.r] + s.t1 - 1;
  w.select(g);
  std::fill(w.ot, w.ot + P.D * kRows, 0.f);
  std::fill(m, m + kRows, kNegInf);
  std::fill(l, l + kRows, 0.f);
  // Rows are (token, group head) pairs, token-major; padding rows sit at the last position.
  for (int64_t ri = 0; ri < rv * 16; ++ri)
    w.pos[ri] = static_cast<float>(ri < rows ? p0 + ri / P.G : p1);
  Products::load_q(P, q, s, rows, w);
  // Key blocks start at absolute multiples of kKeys (never where a chunk, a cached prefix or a
  // window begins), so every row sums its keys in the same order as the decode kernel does.
  const int64_t lo = P.window > 0 ? std::max<int64_t>(0, p0 - P.window + 1) / kKeys * kKeys : 0;
  return {s, rows, p0, p1, lo};
}

template <typename T, int RV, typename Products>
void run_item(const Problem& P, const T* q, const T* k, const T* v, T* out, const Item& it,
              Scratch& w) {
  const int64_t ng = (it.t1 - it.t0 + P.bt - 1) / P.bt;  // sub-blocks, at most kGroups
  alignas(64) float m[kGroups][kRows], l[kGroups][kRows];
  Rows s[kGroups];
  for (int64_t g = 0; g < ng; ++g) s[g] = start_rows<T, Products>(P, q, it, g, RV, w, m[g], l[g]);
  const int64_t lo = s[0].lo, p1 = s[ng - 1].p1;
  const int64_t* sl = P.slots + P.ctx_start[it.r];
  __m512 alpha[RV];
  for (int64_t kb0 = lo; kb0 <= p1; kb0 += kKeys) {
    const int64_t nk = std::min(kKeys, p1 + 1 - kb0);
    if (kb0 + kKeys <= p1)  // the next block's rows load while this one computes
      prefetch_kv(k, v, sl + kb0 + kKeys, std::min(kKeys, p1 + 1 - kb0 - kKeys), P.k_row,
                  it.h * P.k_head, P.v_row, it.h * P.v_head, D_bytes<T>(P));
    Products::load_keys(P, k, v, sl, kb0, nk, it.h, w);
    for (int64_t g = 0; g < ng; ++g) {  // each sub-block sees the keys [lo_g, p1_g] it always did
      if (kb0 < s[g].lo || kb0 > s[g].p1) continue;
      const int64_t nkg = std::min(kKeys, s[g].p1 + 1 - kb0);
      w.select(g);
      Products::template scores<RV>(P, nkg, w);
      // Every row sees the whole block unless it reaches the diagonal or the window's edge.
      const bool full = kb0 + nkg - 1 <= s[g].p0 && (P.window == 0 || kb0 > s[g].p1 - P.window);
      if (!full) mask_block<RV>(P, w.pos, kb0, nkg, w.st.data());
      softmax_block<RV>(w.st.data(), nkg, m[g], l[g], alpha);
      Products::template accumulate<RV>(P, nkg, alpha, w);
    }
  }
  for (int64_t g = 0; g < ng; ++g) {
    w.select(g);
    store_rows(P, s[g].it, s[g].rows, l[g], w.ot, out);
  }
}

template <typename T, typename Products>
void run(const Problem& P, const T* q, const T* k, const T* v, T* out, std::vector<Item>& items) {
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
  std::atomic<int64_t> next{0};
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), n);
  int64_t groups = 1;  // sub-blocks of the largest item
  for (const Item& it : items) groups = std::max(groups, (it.t1 - it.t0 + P.bt - 1) / P.bt);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      Scratch w(P.D, groups);
      for (int64_t i = next++; i < n; i = next++) {
        const Item& it = items[i];
        switch ((std::min(it.t1 - it.t0, P.bt) * P.G + 15) / 16) {
          case 1: run_item<T, 1, Products>(P, q, k, v, out, it, w); break;
          case 2: run_item<T, 2, Products>(P, q, k, v, out, it, w); break;
          case 3: run_item<T, 3, Products>(P, q, k, v, out, it, w); break;
          default: run_item<T, 4, Products>(P, q, k, v, out, it, w); break;
        }
      }
    }
  });
}

#if defined(RADIXKV_AMX)
// bfloat16 on AMX (attn_amx.h): the same items, each row at its own position.
void run_amx(const Problem& P, const c10::BFloat16* q, const c10::BFloat16* k,
             const c10::BFloat16* v, c10::BFloat16* out, std::vector<Item>& items) {
  namespace amx = radixkv_attn_amx;
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
  std::atomic<int64_t> next{0};
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), n);
  const amx::Geometry g{P.D, P.k_row, P.k_head, P.v_row, P.v_head, P.window, P.scale};
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      auto tt = std::make_unique<amx::TileThread>();
      amx::Scratch* w = &tt->w;
      for (int64_t i = next++; i < n; i = next++) {
        const Item& it = items[i];
        const int64_t G = P.G, rows = (it.t1 - it.t0) * G;
        w->rows = rows;
        for (int64_t ri = 0; ri < rows; ++ri) {
          const int64_t tok = P.q_start[it.r] + it.t0 + ri / G, head = it.h * G + ri % G;
          w->pos[ri] = P.prefix[it.r] + it.t0 + ri / G;
          w->set_query(ri, q + tok * P.q_row + head * P.D, P.D);
        }
        amx::attend(g, k, v, P.slots + P.ctx_start[it.r], it.h, *w);
        for (int64_t ri = 0; ri < rows; ++ri) {
          const int64_t tok = P.q_start[it.r] + it.t0 + ri / G, head = it.h * G + ri % G;
          amx::store_row(*w, ri, P.D, out + tok * P.o_row + head * P.D);
        }
      }
    }
  });
}
#endif

}  // namespace
#endif

bool extend_attention_supported() {
#if defined(RADIXKV_AVX512)
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
#if defined(RADIXKV_AVX512)
  using radixkv_extend::Item;
  using radixkv_extend::Problem;
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "q, k, v must be 3-D");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(),
              "q, k, v dtypes differ");
  TORCH_CHECK(k.stride(2) == 1 && v.stride(2) == 1, "k, v rows must be contiguous");
  const int64_t H = q.size(1), D = q.size(2), KV = k.size(1);
  TORCH_CHECK(H % KV == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(H / KV <= radixkv_extend::kRows, "at most 64 query heads per KV head");
  TORCH_CHECK(D % 16 == 0 && D <= 256, "head_dim must be a multiple of 16, at most 256");
  for (const auto* t : {&slots, &ctx_start, &q_start, &new_len, &prefix})
    TORCH_CHECK(t->scalar_type() == torch::kLong && t->is_contiguous(), "index tensors: int64");
  if (q.stride(2) != 1 || q.stride(1) != D) q = q.contiguous();
  auto out = torch::empty({q.size(0), H, D}, q.options());
  Problem P{H, KV, H / KV, D, window, q.stride(0), k.stride(0), v.stride(0), k.stride(1),
            v.stride(1), out.stride(0), static_cast<float>(scale), slots.data_ptr<int64_t>(),
            ctx_start.data_ptr<int64_t>(), q_start.data_ptr<int64_t>(),
            new_len.data_ptr<int64_t>(), prefix.data_ptr<int64_t>()};
  const int64_t bt = std::max<int64_t>(1, radixkv_extend::kRows / P.G);  // tokens per sub-block
  P.bt = bt;
  // The AMX path takes one sub-block per item; the others group up to kGroups on long contexts.
  bool amx = false;
#if defined(RADIXKV_AMX)
  amx = q.scalar_type() == torch::kBFloat16 && radixkv_amx::enabled();
#endif
  std::vector<Item> items;
  for (int64_t r = 0; r < ctx_start.size(0); ++r) {
    const int64_t e = P.new_len[r];
    const bool group = !amx && P.prefix[r] + e >= radixkv_extend::kGroupFrom;
    const int64_t step = group ? bt * radixkv_extend::kGroups : bt;
    for (int64_t t0 = 0; t0 < e; t0 += step) {
      const int64_t t1 = std::min(e, t0 + step), last = P.prefix[r] + t1 - 1;
      const int64_t first = window > 0 ? std::max<int64_t>(0, P.prefix[r] + t0 - window + 1) : 0;
      for (int64_t h = 0; h < KV; ++h) items.push_back({r, h, t0, t1, (t1 - t0) * (last - first + 1)});
    }
  }
  switch (q.scalar_type()) {
    case torch::kFloat:
      run<float, F32Products>(P, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                 out.data_ptr<float>(), items);
      break;
    case torch::kBFloat16:
#if defined(RADIXKV_AMX)
      if (radixkv_amx::enabled()) {
        run_amx(P, q.data_ptr<c10::BFloat16>(), k.data_ptr<c10::BFloat16>(),
                v.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>(), items);
        break;
      }
#endif
#if defined(__AVX512BF16__)
      run<c10::BFloat16, BF16Products>(
#else
      run<c10::BFloat16, F32Products>(
#endif
          P, q.data_ptr<c10::BFloat16>(), k.data_ptr<c10::BFloat16>(),
          v.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>(), items);
      break;
    case torch::kHalf:
      run<c10::Half, F32Products>(P, q.data_ptr<c10::Half>(), k.data_ptr<c10::Half>(),
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

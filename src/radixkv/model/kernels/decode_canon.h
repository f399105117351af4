// Decode attention in the extend kernel's reduction order (AVX-512), so that a request's logits do
// not depend on whether its last token was computed in a prefill chunk or a decode step.
//
// The shared order, per query row at position p with visible keys [lo, p]:
//   - keys in blocks of 64 at ABSOLUTE positions (block b holds keys [64b, 64b + 64));
//   - a score is one f32 chain over the head dim in increasing order: float32 FMAs of the
//     pre-scaled query (q * scale) and the key; bfloat16 VDPBF16PS over the pairs (d, d+1), times
//     the scale afterwards;
//   - per block: m' = max(m, block max), alpha = exp(m - m'), e = exp(s - m'),
//     l = fma(l, alpha, e_0 + e_1 + ... in key order), o = o * alpha + the keys' terms in key order
//     (float32: one FMA per key; bfloat16: the weights rounded to bf16 and one VDPBF16PS per key
//     pair (2c, 2c+1) of the block);
//   - out = o * (1 / l), rounded once.
// The extend kernel keeps rows in vector lanes; here, with one query token, keys sit in the lanes
// for the scores (16 keys' K rows transposed in registers, shared by the G query heads of a KV
// head) and the head dim sits in the lanes for the weighted sum. Masked keys weigh exactly 0 and
// fully masked blocks leave (m, l, o) unchanged, so the extra keys an extend item covers for its
// later rows change nothing for this one.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <cstring>
#include <limits>

#include "simd.h"

#if defined(RADIXKV_AVX512)
namespace radixkv_decode {

using namespace radixkv_simd;

constexpr int64_t kBlockKeys = 64;  // must equal the extend kernel's kKeys
constexpr int kMaxG = 32;           // query heads (of one or more KV heads) in one pass
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Problem {
  int64_t H, KV, G, D, window;                    // window 0: none
  int64_t k_row, v_row, k_head, v_head, width;    // strides (elements); slots per row
  float scale;
  const int64_t* slots;  // [R, width]
  const int64_t* lens;   // [R] context length (the query sits at lens - 1)
};

// One thread's buffers: the query words, the block's scores / weights per head, o per head, and
// 16 keys' rows transposed (words along the head dim, keys in lanes).
struct Scratch {
  alignas(64) float sc[kMaxG][kBlockKeys];  // scores, then weights e
  alignas(64) uint32_t pw[kMaxG][kBlockKeys / 2];  // bf16 weight pairs
  alignas(64) float o[kMaxG][256];
  alignas(64) float kt[256][kBlockKeys];  // the block's K transposed: [word][key]
  alignas(64) uint32_t qw[kMaxG][256];
  float m[kMaxG], l[kMaxG];
};

// float32 (and f16 / bf16 without AVX-512 BF16, widened) operands: a word is one element of the
// head dim; scores from the pre-scaled query.
struct F32Words {
  static int64_t words(const Problem& P) { return P.D; }
  template <typename T>
  static void load_q(const Problem& P, const T* q, uint32_t* dst) {
    float* f = reinterpret_cast<float*>(dst);
    for (int64_t d = 0; d < P.D; ++d) f[d] = to_f(q[d]) * P.scale;
  }
  // Words [i, i + 16) of a K row (D is a multiple of 16: never partial).
  template <typename T>
  static __m512 row16(const T* row, int64_t i, int64_t) { return load16(row + i); }
  static __m512 bcast(const uint32_t* qw, int64_t i) {
    return _mm512_set1_ps(reinterpret_cast<const float*>(qw)[i]);
  }
  static __m512 step(__m512 acc, __m512 kt, __m512 qb) { return _mm512_fmadd_ps(kt, qb, acc); }
  static __m512 finish(__m512 acc, float) { return acc; }
};

#if defined(__AVX512BF16__)
// bfloat16 operands: a word is a pair (d, d+1); the scale multiplies the f32 dot product.
struct BF16Words {
  static int64_t words(const Problem& P) { return P.D / 2; }
  template <typename T>
  static void load_q(const Problem& P, const T* q, uint32_t* dst) { std::memcpy(dst, q, P.D * 2); }
  template <typename T>
  static __m512 row16(const T* row, int64_t i, int64_t nw) {
    return _mm512_maskz_loadu_ps(lanes(nw - i), reinterpret_cast<const float*>(row) + i);
  }
  static __m512 bcast(const uint32_t* qw, int64_t i) {
    return _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(qw[i])));
  }
  static __m512 step(__m512 acc, __m512 kt, __m512 qb) {
    return _mm512_dpbf16_ps(acc, (__m512bh)kt, (__m512bh)qb);
  }
  static __m512 finish(__m512 acc, float scale) { return _mm512_mul_ps(acc, _mm512_set1_ps(scale)); }
};
#endif


// Phase A: the K rows of keys [kb0, kb0 + nk) of KV head h, transposed into w.kt[word][key]
// (keys past nk repeat the last one; their scores are masked).
template <typename T, typename Words>
void load_block_keys(const Problem& P, const T* k, const T* v, const int64_t* sl, int64_t kb0,
                     int64_t nk, int64_t next, int64_t h, Scratch& w) {
  const int64_t nw = Words::words(P);
  const int64_t bytes = P.D * static_cast<int64_t>(sizeof(T));
  const int64_t word_bytes = bytes / nw;
  const int64_t* ahead = sl + kb0 + 2 * kBlockKeys;
  for (int64_t j = 0; j * 16 < nk; ++j) {
    const int64_t pf = std::min<int64_t>(16, next - j * 16);
    for (int64_t i0 = 0; i0 < nw; i0 += 16) {
      // The rows of this head two blocks ahead, the same 16 keys and words as this pass loads,
      // so that the misses spread over the block's work instead of stalling it in a burst.
      for (int64_t c = 0; c < pf; ++c) {
        const int64_t off = i0 * word_bytes;
        __builtin_prefetch(reinterpret_cast<const char*>(k + ahead[j * 16 + c] * P.k_row +
                                                         h * P.k_head) + off, 0, 2);
        __builtin_prefetch(reinterpret_cast<const char*>(v + ahead[j * 16 + c] * P.v_row +
                                                         h * P.v_head) + off, 0, 2);
      }
      __m512 rows[16];
      for (int c = 0; c < 16; ++c) {
        const int64_t key = kb0 + std::min<int64_t>(j * 16 + c, nk - 1);
        rows[c] = Words::row16(k + sl[key] * P.k_row + h * P.k_head, i0, nw);
      }
      transpose16(rows);
      for (int64_t t = 0; t < 16 && i0 + t < nw; ++t)
        _mm512_store_ps(&w.kt[i0 + t][j * 16], rows[t]);
    }
  }
}

// Phase B: scores of GT query heads (from g0) against the block, masked outside [lo, p] (keys
// are in lanes; four groups of 16 keys run as independent chains).
template <typename Words, int GT>
void block_scores(const Problem& P, int64_t g0, int64_t kb0, int64_t nk, int64_t lo, Scratch& w) {
  const int64_t nw = Words::words(P);
  __m512 acc[GT][4];
  for (int g = 0; g < GT; ++g)
    for (int j = 0; j < 4; ++j) acc[g][j] = _mm512_setzero_ps();
  for (int64_t i = 0; i < nw; ++i) {
    __m512 kt[4];
    for (int j = 0; j < 4; ++j) kt[j] = _mm512_load_ps(&w.kt[i][j * 16]);
    for (int g = 0; g < GT; ++g) {
      const __m512 qb = Words::bcast(w.qw[g0 + g], i);
      for (int j = 0; j < 4; ++j) acc[g][j] = Words::step(acc[g][j], kt[j], qb);
    }
  }
  const __m512 neg = _mm512_set1_ps(kNegInf);
  for (int j = 0; j < 4; ++j) {
    // Lane c is key kb0 + 16 j + c: visible iff it is in the context and not before lo.
    const int64_t first = kb0 + j * 16;
    __mmask16 ok = lanes(nk - j * 16);
    if (lo > first) ok &= static_cast<__mmask16>(~lanes(lo - first));
    if (j * 16 >= nk) ok = 0;
    for (int g = 0; g < GT; ++g)
      _mm512_store_ps(&w.sc[g0 + g][j * 16],
                      _mm512_mask_mov_ps(neg, ok, Words::finish(acc[g][j], P.scale)));
  }
}

// The sum of a block's 64 weights (keys in lanes: e[0..15], e[16..31], ...) in the extend
// kernel's pairwise order: e[c] + e[c + 32], then + 16, + 8, + 4, + 2, + 1.
inline float tree_sum(const float* e) {
  const __m512 b = _mm512_add_ps(_mm512_add_ps(_mm512_load_ps(e), _mm512_load_ps(e + 32)),
                                 _mm512_add_ps(_mm512_load_ps(e + 16), _mm512_load_ps(e + 48)));
  // Lane c of fold(x, s) is x[c] + x[c + s] (lanes past 16 - s are not used).
  auto fold = [](__m512 x, int s) {
    const __m512i idx = _mm512_add_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5,
                                                          4, 3, 2, 1, 0),
                                         _mm512_set1_epi32(s));
    return _mm512_add_ps(x, _mm512_permutexvar_ps(_mm512_and_si512(idx, _mm512_set1_epi32(15)), x));
  };
  return _mm512_cvtss_f32(fold(fold(fold(fold(b, 8), 4), 2), 1));
}

// The online-softmax update of one row for one block: its 64 scores e (64-byte aligned; in
// place, scores become weights), its running max m and sum l. Returns alpha, the factor for the
// earlier sum. The AMX path (attn_amx.h) calls this too, so both paths share its arithmetic.
inline float row_softmax(float* e, float& m, float& l) {
  const __m512 neg = _mm512_set1_ps(kNegInf);
  __m512 bm = neg;
  for (int j = 0; j < 4; ++j) bm = _mm512_max_ps(bm, _mm512_load_ps(e + j * 16));
  const float m_old = m;
  const float m_new = std::max(m_old, _mm512_reduce_max_ps(bm));
  const float safe = m_new == kNegInf ? 0.f : m_new;  // -inf - m stays -inf, never NaN
  const __m512 sv = _mm512_set1_ps(safe);
  const float alpha = _mm512_cvtss_f32(exp_neg(_mm512_sub_ps(_mm512_set1_ps(m_old), sv)));
  for (int j = 0; j < 4; ++j)
    _mm512_store_ps(e + j * 16, exp_neg(_mm512_sub_ps(_mm512_load_ps(e + j * 16), sv)));
  // Keys past the context weigh +0 (masked scores), an exact identity in the sum.
  l = std::fma(l, alpha, tree_sum(e));
  m = m_new;
  return alpha;
}

// Phase C: the online-softmax update of head g for this block (scores become weights e).
inline float block_softmax(int64_t g, Scratch& w) { return row_softmax(w.sc[g], w.m[g], w.l[g]); }

// Phase D (float32 values): o = o * alpha + sum_c e_c V_c for GT heads from g0, ND x 16 dims.
template <typename T, int ND, int GT>
void block_values_f32(const Problem& P, const T* v, const int64_t* sl, int64_t kb0, int64_t nk,
                      int64_t h, int64_t g0, const float* alpha, int64_t d0, Scratch& w) {
  __m512 o[GT][ND];
  for (int g = 0; g < GT; ++g)
    for (int i = 0; i < ND; ++i)
      o[g][i] = _mm512_mul_ps(_mm512_load_ps(&w.o[g0 + g][d0 + i * 16]), _mm512_set1_ps(alpha[g]));
  for (int64_t c = 0; c < nk; ++c) {
    const T* vr = v + sl[kb0 + c] * P.v_row + h * P.v_head + d0;
    __m512 vv[ND];
    for (int i = 0; i < ND; ++i) vv[i] = load16(vr + i * 16);
    for (int g = 0; g < GT; ++g) {
      const __m512 e = _mm512_set1_ps(w.sc[g0 + g][c]);
      for (int i = 0; i < ND; ++i) o[g][i] = _mm512_fmadd_ps(vv[i], e, o[g][i]);
    }
  }
  for (int g = 0; g < GT; ++g)
    for (int i = 0; i < ND; ++i) _mm512_store_ps(&w.o[g0 + g][d0 + i * 16], o[g][i]);
}

#if defined(__AVX512BF16__)
// Where dim d of a 32-dim chunk sits in the bfloat16 value accumulators for even ND: unpacking
// two V rows' 512-bit chunks word by word interleaves them per 128-bit lane, so the low vector
// holds dims 0-3, 8-11, 16-19, 24-27 and the high one 4-7, 12-15, 20-23, 28-31. Each lane is its
// own chain over the keys, so where a dim sits changes no bits; the output undoes it.
inline int64_t bf16_lane(int64_t d) {
  const int64_t c = d % 32, lane = c / 8, half = (c % 8) / 4;
  return d - c + half * 16 + lane * 4 + c % 4;
}

// Phase D (bfloat16 values): the weights rounded to bf16 pairs (2c, 2c+1) and one VDPBF16PS per
// pair against the two V rows interleaved, for GT heads from g0. With ND even, o keeps the
// bf16_lane order (two loads and two unpacks per 32 dims of a pair); with ND == 1, dim order.
template <int ND, int GT>
void block_values_bf16(const Problem& P, const c10::BFloat16* v, const int64_t* sl, int64_t kb0,
                       int64_t nk, int64_t h, int64_t g0, const float* alpha, int64_t d0,
                       Scratch& w) {
  for (int g = 0; g < GT; ++g)
    for (int j = 0; j < 4; j += 2) {
      const __m512i pairs = (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(&w.sc[g0 + g][j * 16 + 16]),
                                                         _mm512_load_ps(&w.sc[g0 + g][j * 16]));
      // cvtne2ps puts the first 16 weights in the low half: words 0..7 are pairs of keys
      // j*16 .. j*16+15, words 8..15 those of the next 16.
      _mm512_store_si512(&w.pw[g0 + g][j * 8], pairs);
    }
  const __m512i idx = interleave_idx();
  __m512 o[GT][ND];
  for (int g = 0; g < GT; ++g)
    for (int i = 0; i < ND; ++i)
      o[g][i] = _mm512_mul_ps(_mm512_load_ps(&w.o[g0 + g][d0 + i * 16]), _mm512_set1_ps(alpha[g]));
  for (int64_t cp = 0; 2 * cp < nk; ++cp) {
    const c10::BFloat16* a = v + sl[kb0 + 2 * cp] * P.v_row + h * P.v_head + d0;
    const c10::BFloat16* b =
        2 * cp + 1 < nk ? v + sl[kb0 + 2 * cp + 1] * P.v_row + h * P.v_head + d0 : nullptr;
    __m512 vp[ND];
    if constexpr (ND % 2 == 0) {
      for (int i = 0; i < ND; i += 2) {
        const __m512i x = _mm512_loadu_si512(a + i * 16);
        const __m512i y = b ? _mm512_loadu_si512(b + i * 16) : _mm512_setzero_si512();
        vp[i] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(x, y));
        vp[i + 1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(x, y));
      }
    } else {
      for (int i = 0; i < ND; ++i) {
        const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i * 16));
        const __m256i hi = b ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i * 16))
                             : _mm256_setzero_si256();
        const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        vp[i] = _mm512_castsi512_ps(_mm512_permutexvar_epi16(idx, both));
      }
    }
    for (int g = 0; g < GT; ++g) {
      const __m512bh pb = (__m512bh)_mm512_set1_epi32(static_cast<int>(w.pw[g0 + g][cp]));
      for (int i = 0; i < ND; ++i) o[g][i] = _mm512_dpbf16_ps(o[g][i], (__m512bh)vp[i], pb);
    }
  }
  for (int g = 0; g < GT; ++g)
    for (int i = 0; i < ND; ++i) _mm512_store_ps(&w.o[g0 + g][d0 + i * 16], o[g][i]);
}
#endif

// Heads [g0, g0 + gn) of KV head h attend in GT-sized groups (a runtime count dispatched to the
// templates above).
#define RKV_BY_GT(GTMAX, call)                                   \
  for (int64_t gs = g0; gs < g0 + gn; gs += GTMAX) {             \
    const int64_t left = std::min<int64_t>(GTMAX, g0 + gn - gs); \
    if (left >= 4 && GTMAX >= 4) { constexpr int GT = 4; call; } \
    else if (left == 3 && GTMAX >= 3) { constexpr int GT = 3; call; } \
    else if (left == 2 && GTMAX >= 2) { constexpr int GT = 2; call; } \
    else { constexpr int GT = 1; call; }                        \
  }

// One work item: request r, KV heads [h0, h0 + nh), query heads [head0, head0 + gn) of each
// (nh * gn <= kMaxG; nh > 1 only with every query head, head0 == 0). The scratch holds KV head
// h0 + i's query heads at rows [i * gn, (i + 1) * gn). Several KV heads per item read a wider
// run of each key's row (their heads are contiguous in the pool) in one pass over the context;
// every head's arithmetic is the single-head item's, in the same order. Each head prefetches its
// own rows two blocks ahead while its keys load (load_block_keys).
template <typename T, typename Words, int ND>
void decode_item(const Problem& P, const T* q, const T* k, const T* v, T* out, int64_t r,
                 int64_t h0, int64_t nh, int64_t head0, int64_t gn, Scratch& w) {
  constexpr int GV = ND >= 16 ? 1 : (ND >= 8 ? 2 : 4);  // GV x ND value accumulators <= 16
  const int64_t p = P.lens[r] - 1, D = P.D, rows = nh * gn;
  const int64_t* sl = P.slots + r * P.width;
  const int64_t lo = P.window > 0 ? std::max<int64_t>(0, p - P.window + 1) : 0;
  // Query head of scratch row j.
  auto head_of = [&](int64_t j) { return (h0 + j / gn) * P.G + head0 + j % gn; };
  for (int64_t j = 0; j < rows; ++j) {
    Words::load_q(P, q + (r * P.H + head_of(j)) * D, w.qw[j]);
    w.m[j] = kNegInf;
    w.l[j] = 0.f;
    std::fill(w.o[j], w.o[j] + D, 0.f);
  }
  float alpha[kMaxG];
  for (int64_t kb0 = lo / kBlockKeys * kBlockKeys; kb0 <= p; kb0 += kBlockKeys) {
    const int64_t nk = std::min<int64_t>(kBlockKeys, p + 1 - kb0);
    // Keys of the next block (their rows load while this one computes).
    const int64_t next = std::min(kBlockKeys, p + 1 - kb0 - 2 * kBlockKeys);
    for (int64_t i = 0; i < nh; ++i) {
      const int64_t h = h0 + i, g0 = i * gn;
      load_block_keys<T, Words>(P, k, v, sl, kb0, nk, next, h, w);
      RKV_BY_GT(4, (block_scores<Words, GT>(P, gs, kb0, nk, lo, w)))
      for (int64_t g = g0; g < g0 + gn; ++g) alpha[g] = block_softmax(g, w);
      // The head dim in passes of ND x 16 (each o element is its own chain over the keys, so
      // the passes change no bits); one pass for D = ND x 16.
      for (int64_t d0 = 0; d0 < D; d0 += ND * 16) {
#if defined(__AVX512BF16__)
        if constexpr (std::is_same_v<Words, BF16Words>) {
          RKV_BY_GT(GV, (block_values_bf16<ND, GT>(P, v, sl, kb0, nk, h, gs, alpha + gs, d0, w)))
          continue;
        }
#endif
        RKV_BY_GT(GV, (block_values_f32<T, ND, GT>(P, v, sl, kb0, nk, h, gs, alpha + gs, d0, w)))
      }
    }
  }
  for (int64_t j = 0; j < rows; ++j) {
    T* dst = out + (r * P.H + head_of(j)) * D;
    const float inv = 1.f / w.l[j];
#if defined(__AVX512BF16__)
    if constexpr (std::is_same_v<Words, BF16Words> && ND % 2 == 0) {
      for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(w.o[j][bf16_lane(d)] * inv);
      continue;
    }
#endif
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(w.o[j][d] * inv);
  }
}
#undef RKV_BY_GT

}  // namespace radixkv_decode
#endif

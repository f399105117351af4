// The parts of the extend-attention kernel (extend_attention.cpp) shared by its float32 and
// bfloat16 products: the problem's description, work items, per-thread scratch, the mask and
// the online softmax over one block of keys. Layout conventions: rows (query token x grouped
// head, token-major) sit in vector lanes; S^T is [keys][kRows], O^T is [D][kRows].
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "simd.h"

#if defined(RADIXKV_AVX512)
namespace radixkv_extend {

using namespace radixkv_simd;

constexpr int64_t kRows = 64;  // query rows per work item (4 vectors of 16)
constexpr int64_t kKeys = 64;  // keys per block
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Pins a loaded vector in a register: without it GCC folds the load into each of the 4 FMAs
// that use it (4x the loads, and the loops become load-bound).
#if defined(RADIXKV_ON_AVX2)
inline void keep(__m512& x) { asm volatile("" : "+v"(x.lo), "+v"(x.hi)); }
inline void keep(__m512i& x) { asm volatile("" : "+v"(x.lo), "+v"(x.hi)); }
#else
inline void keep(__m512& x) { asm volatile("" : "+v"(x)); }
inline void keep(__m512i& x) { asm volatile("" : "+v"(x)); }
#endif

struct Problem {
  int64_t H, KV, G, D, window;  // window 0: none
  int64_t q_row, k_row, v_row, k_head, v_head, o_row;  // strides in elements
  float scale;
  const int64_t* slots;      // concatenated contexts
  const int64_t* ctx_start;  // [R] offset of request r's context in `slots`
  const int64_t* q_start;    // [R] first row of request r in q / out
  const int64_t* new_len;    // [R] e
  const int64_t* prefix;     // [R] position of the first new token
  int64_t bt = 1;            // query tokens per sub-block (kRows / G)
};

struct Item {
  int64_t r, h, t0, t1, cost;  // request, KV head, its query tokens [t0, t1), work estimate
};

// Sub-block g of an item whose sub-blocks hold `bt` query tokens each.
inline Item sub_item(const Item& it, int64_t bt, int64_t g) {
  return {it.r, it.h, it.t0 + g * bt, std::min(it.t1, it.t0 + (g + 1) * bt), 0};
}

// Query rows are worked on in groups of up to kRows ("sub-blocks"); an item holds up to kGroups
// of them, which share every key block loaded from the pool (long contexts: each K/V block is
// read from memory once per item, not once per 64 rows). Each row's arithmetic is the same
// whatever group it sits in: the grouping changes no bits.
constexpr int64_t kGroups = 4;
// Contexts whose last position reaches this many keys group their sub-blocks; shorter ones keep
// one sub-block per item (their K/V stays in the core's cache anyway, and more items balance
// the threads better).
constexpr int64_t kGroupFrom = 1024;

// One thread's buffers: f32 operands (qt, kb, vb) or bf16 pairs (qt2, kb2, vb2, pt2), the
// scores S^T, the output O^T and each row's position. qt, qt2, ot and pos point at the selected
// sub-block's own buffers (`select`); the key block and the scores are shared.
struct Scratch {
  std::vector<float> qt_all, kb, vb, st, ot_all, pos_all;
  const float* krow[kKeys];  // the block's f32 K / V rows: in the pool (float32), else in kb / vb
  const float* vrow[kKeys];
  std::vector<uint32_t> qt2_all, kb2, vb2, pt2;
  int64_t D;
  float* qt = nullptr;
  float* ot = nullptr;
  float* pos = nullptr;
  uint32_t* qt2 = nullptr;
  // `groups`: the most sub-blocks an item of this call holds (1 unless a context is long), so a
  // call of short contexts allocates no more than one sub-block's buffers.
  Scratch(int64_t D_, int64_t groups)
      : qt_all(groups * D_ * kRows), kb(kKeys * D_), vb(kKeys * D_), st(kKeys * kRows),
        ot_all(groups * D_ * kRows), pos_all(groups * kRows), qt2_all(groups * D_ / 2 * kRows),
        kb2(kKeys * D_ / 2), vb2(kKeys / 2 * D_), pt2(kKeys / 2 * kRows), D(D_) {
    select(0);
  }
  void select(int64_t g) {
    qt = qt_all.data() + g * D * kRows;
    ot = ot_all.data() + g * D * kRows;
    pos = pos_all.data() + g * kRows;
    qt2 = qt2_all.data() + g * D / 2 * kRows;
  }
};

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

// The sum of a block's weights e[0..nk) (row vectors kRows floats apart; keys past nk count as
// +0, an exact identity since every weight is >= +0) in the fixed pairwise order the decode kernel
// also uses (decode_canon.h): e[c] + e[c + 32], then + 16, + 8, + 4, + 2, + 1. A tree, not a
// chain: no 64-add latency chain per block, and the order does not depend on the layout.
inline __m512 tree_sum(const float* e, int64_t nk) {
  __m512 t[32];
  for (int64_t c = 0; c < 32; ++c) {
    const __m512 a = c < nk ? _mm512_loadu_ps(e + c * kRows) : _mm512_setzero_ps();
    t[c] = c + 32 < nk ? _mm512_add_ps(a, _mm512_loadu_ps(e + (c + 32) * kRows)) : a;
  }
  for (int half = 16; half >= 1; half /= 2)
    for (int c = 0; c < half; ++c) t[c] = _mm512_add_ps(t[c], t[c + half]);
  return t[0];
}

// Online softmax over one key block (in place: S^T becomes P^T); returns the rescale factors of
// the earlier accumulation in `alpha`. Rows with no visible key so far keep m = -inf, P = 0.
template <int RV>
inline void softmax_block(float* st, int64_t nk, float* m, float* l, __m512* alpha) {
  const __m512 neg = _mm512_set1_ps(kNegInf);
  for (int v = 0; v < RV; ++v) {
    __m512 bm = neg;
    for (int64_t c = 0; c < nk; ++c)
      bm = _mm512_max_ps(bm, _mm512_loadu_ps(st + c * kRows + v * 16));
    const __m512 m_old = _mm512_loadu_ps(m + v * 16);
    const __m512 m_new = _mm512_max_ps(m_old, bm);
    // -inf (nothing visible yet) is replaced by 0 so that -inf - m stays -inf, never NaN.
    const __m512 safe = _mm512_mask_mov_ps(m_new, _mm512_cmp_ps_mask(m_new, neg, _CMP_EQ_OQ),
                                           _mm512_setzero_ps());
    alpha[v] = exp_neg(_mm512_sub_ps(m_old, safe));
    for (int64_t c = 0; c < nk; ++c) {
      float* s = st + c * kRows + v * 16;
      _mm512_storeu_ps(s, exp_neg(_mm512_sub_ps(_mm512_loadu_ps(s), safe)));
    }
    const __m512 sum = tree_sum(st + v * 16, nk);
    _mm512_storeu_ps(l + v * 16, _mm512_fmadd_ps(_mm512_loadu_ps(l + v * 16), alpha[v], sum));
    _mm512_storeu_ps(m + v * 16, m_new);
  }
}

}  // namespace radixkv_extend
#endif

// The row-invariant GEMM's arithmetic, free of torch (gemm.cpp binds it; a plain C++ harness can
// time it). See gemm.cpp for the contract: every output element is ONE f32 FMA chain over k in
// increasing order, then + bias, then (bf16) one rounding; nothing below changes that order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "isa.h"

#if defined(RADIXKV_AVX512)

namespace radixkv_gemm {

constexpr int64_t kBlock = 16;  // output features per packed block

inline int64_t padded(int64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

// One weight element type: Word is one packed W entry (one f32, or one bf16 pair as 32 bits);
// kPerWord is how many k values a Word spans.
struct F32Ops {
  using Word = float;
  static constexpr int64_t kPerWord = 1;
};

struct BF16Ops {
  using Word = uint32_t;
  static constexpr int64_t kPerWord = 2;
};

// bfloat16 on VDPBF16PS: the same packed pairs, x kept as bf16 (each row's pair (k, k + 1) is
// one 32-bit word, broadcast), and one instruction per pair per 16 outputs. Each output is still
// ONE f32 chain over the pairs in increasing order, but a link of it is the instruction's own
// two-product step (its rounding is the CPU's: see docs/determinism.md), not two FMAs.
struct BF16DotOps {
  using Word = uint32_t;
  static constexpr int64_t kPerWord = 2;
};

// The element type a tile reads x in: f32 (float32 rows, or bfloat16 rows widened once per row
// block), or the bf16 bits themselves for the dot-product kernel.
template <typename Ops>
using XOf = std::conditional_t<std::is_same_v<Ops, BF16DotOps>, uint16_t, float>;

// The blocking (none of it changes a chain's order of terms, only which chains run side by side
// and where a partial sum waits in memory between K blocks):
//   mt x nt    the register tile: mt rows x nt blocks of 16 outputs;
//   kc         k values per K block (a W micro-panel of kc x 16 nt stays in L1 while the row
//              tiles of a row block pass over it);
//   mc         rows per row block (their x, kc wide, stays in L2 while the W panels pass).
struct Blocking {
  int64_t mt, nt, kc, mc;
};

// What one tile call needs: f32 x rows (ldx floats apart), W blocks (ldw words apart), the f32
// partial sums (ldc floats apart), and the word range of this K block.
template <typename Ops>
struct TileArgs {
  const XOf<Ops>* x;  // at k value k0 * kPerWord
  int64_t ldx;
  const typename Ops::Word* w;  // first block of the panel, at word k0
  int64_t ldw;                  // words between two blocks (K words x 16)
  float* c;
  int64_t ldc;
  int64_t kw;  // words in this K block
  bool first;  // start the chains at 0 (else continue from c)
};

template <typename Ops, int MT, int NT>
void tile(const TileArgs<Ops>& a) {
  __m512 acc[MT][NT];
  for (int m = 0; m < MT; ++m)
    for (int j = 0; j < NT; ++j)
      acc[m][j] = a.first ? _mm512_setzero_ps() : _mm512_loadu_ps(a.c + m * a.ldc + j * kBlock);
  if constexpr (Ops::kPerWord == 1) {
    for (int64_t k = 0; k < a.kw; ++k) {
      __m512 wv[NT];
      for (int j = 0; j < NT; ++j) wv[j] = _mm512_loadu_ps(a.w + j * a.ldw + k * kBlock);
      for (int m = 0; m < MT; ++m) {
        const __m512 xb = _mm512_set1_ps(a.x[m * a.ldx + k]);
        for (int j = 0; j < NT; ++j) acc[m][j] = _mm512_fmadd_ps(xb, wv[j], acc[m][j]);
      }
    }
  } else if constexpr (std::is_same_v<Ops, BF16DotOps>) {
#if defined(__AVX512BF16__)
    for (int64_t k = 0; k < a.kw; ++k) {
      __m512i wv[NT];  // the pairs (k, k + 1) of 16 outputs per block
      for (int j = 0; j < NT; ++j) wv[j] = _mm512_loadu_si512(a.w + j * a.ldw + k * kBlock);
      for (int m = 0; m < MT; ++m) {
        int32_t pair;
        std::memcpy(&pair, a.x + m * a.ldx + 2 * k, sizeof(pair));
        const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
        for (int j = 0; j < NT; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], xb, (__m512bh)wv[j]);
      }
    }
#endif
  } else {
    const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    for (int64_t k = 0; k < a.kw; ++k) {
      __m512 we[NT], wo[NT];  // the f32 values of k (even) and k + 1 (odd) of 16 outputs
      for (int j = 0; j < NT; ++j) {
        const __m512i w = _mm512_loadu_si512(a.w + j * a.ldw + k * kBlock);
        we[j] = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
        wo[j] = _mm512_castsi512_ps(_mm512_and_si512(w, hi));
      }
      for (int m = 0; m < MT; ++m) {
        const float* xr = a.x + m * a.ldx + 2 * k;
        const __m512 xe = _mm512_set1_ps(xr[0]);
        for (int j = 0; j < NT; ++j) acc[m][j] = _mm512_fmadd_ps(xe, we[j], acc[m][j]);
        const __m512 xo = _mm512_set1_ps(xr[1]);
        for (int j = 0; j < NT; ++j) acc[m][j] = _mm512_fmadd_ps(xo, wo[j], acc[m][j]);
      }
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int j = 0; j < NT; ++j) _mm512_storeu_ps(a.c + m * a.ldc + j * kBlock, acc[m][j]);
}

template <typename Ops>
using TileFn = void (*)(const TileArgs<Ops>&);

template <typename Ops, int NT>
TileFn<Ops> pick_rows(int64_t mt) {
  switch (mt) {
    case 8: return tile<Ops, 8, NT>;
    case 7: return tile<Ops, 7, NT>;
    case 6: return tile<Ops, 6, NT>;
    case 5: return tile<Ops, 5, NT>;
    case 4: return tile<Ops, 4, NT>;
    case 3: return tile<Ops, 3, NT>;
    case 2: return tile<Ops, 2, NT>;
    default: return tile<Ops, 1, NT>;
  }
}

template <typename Ops>
TileFn<Ops> pick(int64_t mt, int64_t nt) {
  switch (nt) {
    case 4: return pick_rows<Ops, 4>(mt);
    case 3: return pick_rows<Ops, 3>(mt);
    case 2: return pick_rows<Ops, 2>(mt);
    default: return pick_rows<Ops, 1>(mt);
  }
}

// The f32 sums of rows [0, mt) x outputs [n0, n0 + 16 * nb) -> out, + bias, rounded to T
// (float, or uint16_t holding bfloat16 bits).
template <typename T>
void finish(const float* c, int64_t ldc, int64_t mt, int64_t n0, int64_t nb, int64_t n,
            const float* bias, T* out, int64_t ldo) {
  for (int64_t m = 0; m < mt; ++m)
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t o = n0 + j * kBlock;
      if (o >= n) break;
      const __mmask16 live = n - o >= kBlock ? static_cast<__mmask16>(0xFFFF)
                                             : static_cast<__mmask16>((1u << (n - o)) - 1);
      __m512 s = _mm512_loadu_ps(c + m * ldc + j * kBlock);
      if (bias) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(live, bias + o));
      if constexpr (std::is_same_v<T, float>) {
        _mm512_mask_storeu_ps(out + m * ldo + o, live, s);
      } else {
#if defined(__AVX512BF16__)
        const __m256i h = (__m256i)_mm512_cvtneps_pbh(s);  // round to nearest even
#else
        const __m256i h = radixkv_isa::to_bf16(s);
#endif
        _mm256_mask_storeu_epi16(out + m * ldo + o, live, h);
      }
    }
}

// Rows [r0, r0 + rb) of x as a tile reads them, k values contiguous: float32 rows and the dot
// kernel's bf16 rows are used in place, other bfloat16 rows (uint16_t bits) are widened
// (exactly) into `buf`.
template <typename Ops, typename T>
const XOf<Ops>* tile_rows(const T* x, int64_t r0, int64_t rb, int64_t k,
                          std::vector<float>& buf) {
  if constexpr (std::is_same_v<T, XOf<Ops>>) {
    return x + r0 * k;
  } else {
    buf.resize(rb * k);
    const uint16_t* src = x + r0 * k;
    for (int64_t i = 0; i < rb * k; ++i) {
      const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
      std::memcpy(&buf[i], &bits, sizeof(float));
    }
    return buf.data();
  }
}

// x [M, K] in T, packed W, out [M, n] in T. `pfor(begin, end, grain, fn(b, e))` runs fn over a
// split of [begin, end) on the threads. ONE parallel region: each thread owns a range of panels
// (nt blocks of 16 outputs) for every row block, so the threads never wait for each other inside
// a product (a shared host descheduling one thread stalls only its own panels); a bfloat16 row
// block is widened by each thread for itself (K values per row, against K x N / threads FMAs).
template <typename Ops, typename T, typename PFor>
void run(const Blocking& bl, const T* x, int64_t m_rows, int64_t kw_total,
         const typename Ops::Word* w, int64_t n, const float* bias, T* out, const PFor& pfor) {
  const int64_t nblocks = padded(n) / kBlock;
  const int64_t nt = bl.nt;
  const int64_t panels = (nblocks + nt - 1) / nt;
  const int64_t kc = bl.kc / Ops::kPerWord;
  const int64_t ldw = kw_total * kBlock;
  const int64_t k_total = kw_total * Ops::kPerWord;
  const int64_t ldc = nt * kBlock;
  // float32 outputs whose rows hold whole blocks: the chains run in `out` itself (the partial
  // sums wait there between K blocks, as they would in cbuf; the same values), which saves a copy
  // of every output through cbuf; the bias, if any, is added in place at the end.
  constexpr bool kF32Out = std::is_same_v<T, float>;
  const bool direct = kF32Out && n % kBlock == 0;
  pfor(0, panels, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> xbuf;
    std::vector<float> cbuf(direct ? 0 : std::min(bl.mc, m_rows) * ldc);
    for (int64_t r0 = 0; r0 < m_rows; r0 += bl.mc) {
      const int64_t rb = std::min(bl.mc, m_rows - r0);
      const XOf<Ops>* xf = tile_rows<Ops>(x, r0, rb, k_total, xbuf);
      for (int64_t p = begin; p < end; ++p) {
        const int64_t b0 = p * nt, nb = std::min(nt, nblocks - b0);
        float* c = cbuf.data();
        int64_t c_ld = ldc;
        if constexpr (kF32Out) {
          if (direct) c = out + r0 * n + b0 * kBlock, c_ld = n;
        }
        for (int64_t k0 = 0; k0 < kw_total; k0 += kc) {
          const int64_t kw = std::min(kc, kw_total - k0);
          for (int64_t m0 = 0; m0 < rb; m0 += bl.mt) {
            const int64_t mt = std::min<int64_t>(bl.mt, rb - m0);
            TileArgs<Ops> a{xf + m0 * k_total + k0 * Ops::kPerWord, k_total,
                            w + b0 * ldw + k0 * kBlock, ldw, c + m0 * c_ld, c_ld, kw, k0 == 0};
            pick<Ops>(mt, nb)(a);
          }
        }
        if (!direct || bias) finish<T>(c, c_ld, rb, b0 * kBlock, nb, n, bias, out + r0 * n, n);
      }
    }
  });
}

}  // namespace radixkv_gemm
#endif

// y = x W^T (+ b) for any number of rows M, on AVX-512 CPUs, with a reduction order that does not
// depend on M: every output element is ONE f32 accumulator chain over k in increasing order (one
// FMA per k, on the exact f32 values of the inputs; bfloat16 values widen to f32 losslessly), then
// + bias, then (bf16) one rounding to nearest even. Tiling, threading and K blocking only decide
// which chains run side by side and where a chain's f32 partial sum waits in memory between K
// blocks (a lossless store and reload), never the order of its terms. So a request's row of every
// projection is bit-identical whatever else is in the batch (the "batch-invariant matmul" of
// Thinking Machines' "Defeating Nondeterminism in LLM Inference"), for decode steps and prefill
// chunks alike.
//
// Why bfloat16 also runs f32 FMAs rather than VDPBF16PS: on the CPUs measured here (AVX-512 BF16,
// no AMX) a VDPBF16PS retires at about a quarter of the FMA rate, so the two FMAs it replaces are
// faster; widening a bf16 weight pair costs two cheap integer ops per 16 outputs, shared by every
// row of the tile. Measured at 1,152 rows: 2x the VDPBF16PS kernel (docs/determinism.md).
//
// W is repacked once into blocks of 16 output features, K contiguous inside a block:
//   float32:  [N/16, K, 16]        x[m, k] broadcast against 16 outputs;
//   bfloat16: [N/16, K/2, 16, 2]   one 512-bit load holds the pairs (k, k+1) of 16 outputs: a
//                                  shift and a mask give the two f32 vectors of k and k + 1.
// x is read as f32: bfloat16 rows are widened once per row block into a scratch buffer.
// N is padded to a multiple of 16 with zero rows (the padded outputs are never stored).
// Register tile: MT rows x NT blocks of 16 outputs (at most 8 x 3 = 24 accumulators); a thread owns
// whole panels of NT blocks; rows are taken in blocks of kRowsPerBlock (their x stays in L2) and K
// in blocks of kKc (a W micro-panel stays in L1 while the rows of a block pass over it).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kBlock = 16;         // output features per packed block
constexpr int64_t kKc = 256;           // k values (f32) per K block; bf16: kKc / 2 pairs
constexpr int64_t kRowsPerBlock = 96;  // rows per outer row block (a multiple of 8)

int64_t padded(int64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

#if defined(__AVX512F__)
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

// What one tile call needs: f32 x rows (ldx floats apart), W blocks (ldw words apart), the f32
// partial sums (ldc floats apart), and the word range of this K block.
template <typename Ops>
struct TileArgs {
  const float* x;  // at k value k0 * kPerWord
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

// The f32 sums of rows [0, mt) x outputs [n0, n0 + 16 * nb) -> out, + bias, rounded to T.
template <typename T>
void finish(const float* c, int64_t ldc, int64_t mt, int64_t n0, int64_t nb, int64_t n,
            const float* bias, T* out, int64_t ldo) {
  for (int64_t m = 0; m < mt; ++m)
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t o = n0 + j * kBlock;
      if (o >= n) break;
      const __mmask16 live =
          n - o >= kBlock ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - o)) - 1);
      __m512 s = _mm512_loadu_ps(c + m * ldc + j * kBlock);
      if (bias) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(live, bias + o));
      if constexpr (std::is_same_v<T, float>) {
        _mm512_mask_storeu_ps(out + m * ldo + o, live, s);
      } else {
#if defined(__AVX512BF16__)
        const __m256i h = (__m256i)_mm512_cvtneps_pbh(s);  // round to nearest even
        _mm256_mask_storeu_epi16(out + m * ldo + o, live, h);
#endif
      }
    }
}

// Rows [r0, r0 + rb) of x as f32, k values contiguous: float32 rows are used in place, bfloat16
// rows are widened (exactly) into `buf`.
template <typename T>
const float* f32_rows(const T* x, int64_t r0, int64_t rb, int64_t k, std::vector<float>& buf) {
  if constexpr (std::is_same_v<T, float>) {
    return x + r0 * k;
  } else {
    buf.resize(rb * k);
    const uint16_t* src = reinterpret_cast<const uint16_t*>(x) + r0 * k;
    at::parallel_for(0, rb, 8, [&](int64_t b, int64_t e) {
      for (int64_t i = b * k; i < e * k; ++i) {
        const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
        std::memcpy(&buf[i], &bits, sizeof(float));
      }
    });
    return buf.data();
  }
}

// x [M, K] in T, packed W, out [M, n] in T. Panels of NT blocks are split over threads per row
// block.
template <typename Ops, typename T>
void run(const T* x, int64_t m_rows, int64_t kw_total, const typename Ops::Word* w, int64_t n,
         const float* bias, T* out) {
  const int64_t nblocks = padded(n) / kBlock;
  const int64_t nt = m_rows >= 4 ? 3 : 4;
  const int64_t panels = (nblocks + nt - 1) / nt;
  const int64_t kc = kKc / Ops::kPerWord;
  const int64_t ldw = kw_total * kBlock;
  const int64_t k_total = kw_total * Ops::kPerWord;
  std::vector<float> xbuf;
  for (int64_t r0 = 0; r0 < m_rows; r0 += kRowsPerBlock) {
    const int64_t rb = std::min(kRowsPerBlock, m_rows - r0);
    const float* xf = f32_rows(x, r0, rb, k_total, xbuf);
    at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> cbuf(kRowsPerBlock * nt * kBlock);
      const int64_t ldc = nt * kBlock;
      for (int64_t p = begin; p < end; ++p) {
        const int64_t b0 = p * nt, nb = std::min(nt, nblocks - b0);
        for (int64_t k0 = 0; k0 < kw_total; k0 += kc) {
          const int64_t kw = std::min(kc, kw_total - k0);
          for (int64_t m0 = 0; m0 < rb; m0 += 8) {
            const int64_t mt = std::min<int64_t>(8, rb - m0);
            TileArgs<Ops> a{xf + m0 * k_total + k0 * Ops::kPerWord, k_total,
                            w + b0 * ldw + k0 * kBlock, ldw, cbuf.data() + m0 * ldc, ldc, kw,
                            k0 == 0};
            pick<Ops>(mt, nb)(a);
          }
        }
        finish<T>(cbuf.data(), ldc, rb, b0 * kBlock, nb, n, bias, out + r0 * n, n);
      }
    });
  }
}
#endif

void check(const torch::Tensor& x, const torch::Tensor& packed, int64_t n,
           const c10::optional<torch::Tensor>& bias, torch::ScalarType dtype) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous 2-D tensor");
  TORCH_CHECK(x.scalar_type() == dtype && packed.scalar_type() == dtype, "dtype mismatch");
  TORCH_CHECK(packed.numel() == padded(n) * x.size(1), "packed weight does not fit x");
  TORCH_CHECK(!bias || (bias->scalar_type() == torch::kFloat && bias->numel() == n &&
                        bias->is_contiguous()),
              "bias must be a contiguous float32 vector of n values");
}

}  // namespace

bool gemm_f32_supported() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

bool gemm_bf16_supported() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

// w [N, K] -> the packed layout above (bf16 needs K % 2 == 0).
torch::Tensor gemm_pack(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2, "weight must be 2-D");
  const int64_t n = w.size(0), k = w.size(1), np = padded(n);
  auto wp = w.contiguous();
  if (np != n) wp = torch::cat({wp, torch::zeros({np - n, k}, w.options())});
  if (w.scalar_type() == torch::kBFloat16) {
    TORCH_CHECK(k % 2 == 0, "bf16 packing needs an even number of in features");
    return wp.view({np / kBlock, kBlock, k / 2, 2}).permute({0, 2, 1, 3}).contiguous();
  }
  TORCH_CHECK(w.scalar_type() == torch::kFloat, "float32 or bfloat16 weights only");
  return wp.view({np / kBlock, kBlock, k}).transpose(1, 2).contiguous();
}

// x [M, K] (contiguous) times the packed W [N, K] -> [M, N] in x's dtype; bias f32 [N] or none.
torch::Tensor gemm(torch::Tensor x, torch::Tensor packed, int64_t n,
                   c10::optional<torch::Tensor> bias) {
  const int64_t m_rows = x.size(0), k = x.size(1);
  auto out = torch::empty({m_rows, n}, x.options());
  const float* bp = bias ? bias->data_ptr<float>() : nullptr;
  if (m_rows == 0) return out;
  if (x.scalar_type() == torch::kFloat) {
#if defined(__AVX512F__)
    check(x, packed, n, bias, torch::kFloat);
    run<F32Ops, float>(x.data_ptr<float>(), m_rows, k, packed.data_ptr<float>(), n, bp,
                       out.data_ptr<float>());
    return out;
#endif
  } else if (x.scalar_type() == torch::kBFloat16) {
#if defined(__AVX512BF16__)
    check(x, packed, n, bias, torch::kBFloat16);
    TORCH_CHECK(k % 2 == 0, "bf16 gemm needs an even number of in features");
    run<BF16Ops, c10::BFloat16>(
        x.data_ptr<c10::BFloat16>(), m_rows, k / 2,
        reinterpret_cast<const uint32_t*>(packed.data_ptr<c10::BFloat16>()), n, bp,
        out.data_ptr<c10::BFloat16>());
    return out;
#endif
  }
  TORCH_CHECK(false, "gemm: unsupported dtype or CPU (", x.scalar_type(), ")");
}

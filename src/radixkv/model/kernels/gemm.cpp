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
// bfloat16 has three paths, one per process (`set_bf16_gemm`, called once by Python when the
// module loads, before any product; radixkv.model.kernels picks it by a measurement made at build
// time, or $RADIXKV_BF16_GEMM forces it):
//   "fma"  f32 FMAs on widened values (above: the same bits on every AVX-512 CPU);
//   "dot"  VDPBF16PS on bf16 pairs (gemm_core.h BF16DotOps: one chain too, other bits; the
//          fastest on CPUs whose VDPBF16PS runs at the FMA rate, e.g. AMD Zen 4; on Intel's
//          Sapphire Rapids without AMX it retires at a quarter of it and "fma" is 2x faster);
//   "amx"  AMX tiles for weights whose K is a multiple of 32 (gemm_amx.h: row-invariant, other
//          bits), "fma" for the others (chosen per weight, never per call).
//
// W is repacked once into blocks of 16 output features, K contiguous inside a block:
//   float32:  [N/16, K, 16]        x[m, k] broadcast against 16 outputs;
//   bfloat16: [N/16, K/2, 16, 2]   one 512-bit load holds the pairs (k, k+1) of 16 outputs: a
//                                  shift and a mask give the two f32 vectors of k and k + 1.
// x is read as f32: bfloat16 rows are widened once per row block into a scratch buffer.
// N is padded to a multiple of 16 with zero rows (the padded outputs are never stored).
// Register tile: MT rows x NT blocks of 16 outputs (at most 8 x 3 = 24 accumulators); a thread owns
// whole panels of NT blocks for every row block (one parallel region per product); rows are taken
// in blocks of kRowsPerBlock (their x stays in L2) and K in blocks of kKc. The arithmetic lives
// in gemm_core.h (free of torch); this file binds it.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "gemm_amx.h"
#include "kernels.h"
#include "gemm_core.h"

namespace {

#if defined(RADIXKV_AVX512)
using radixkv_gemm::BF16DotOps;
using radixkv_gemm::BF16Ops;
using radixkv_gemm::Blocking;
using radixkv_gemm::F32Ops;
using radixkv_gemm::padded;

// The blocking of a product of m_rows rows. The reduction order never depends on it (only which
// chains run side by side does): 1-3 rows take 4 blocks of outputs per tile (more chains in flight
// while W streams from memory), more rows 8 x 3. The VDPBF16PS kernel (`dot`) does twice the
// work per instruction, so it wants fewer loads per product and longer K blocks: 6 x 4 tiles
// (10 loads per 24 products), 1,024 k values and 192 rows per block (on Zen 4, 1B shapes at
// 64-1,024 rows: 410-440 GFLOP/s on 2 cores, against 350-410 with the FMA kernel's blocking).
// Its panels of 4 blocks become panels of 3 where that loads the busiest thread with fewer
// blocks (the default model's 576 outputs: 9 panels of 4 on 2 threads run 5 against 4).
Blocking blocking(int64_t m_rows, int64_t n = 0, bool dot = false) {
  if (dot) {
    const int64_t blocks = padded(n) / 16, threads = std::max(1, at::get_num_threads());
    const auto busiest = [&](int64_t nt) {
      return ((blocks + nt - 1) / nt + threads - 1) / threads * nt;
    };
    const int64_t nt = busiest(3) < busiest(4) ? 3 : 4;
    return Blocking{/*mt=*/m_rows >= 4 ? 6 : 8, nt, /*kc=*/1024, /*mc=*/192};
  }
#if defined(RADIXKV_ON_AVX2)
  // 16 ymm registers: 6 rows x 1 block is 12 accumulators + 2 weight halves + a broadcast.
  return Blocking{/*mt=*/6, /*nt=*/1, /*kc=*/256, /*mc=*/96};
#else
  return Blocking{/*mt=*/8, /*nt=*/m_rows >= 4 ? 3 : 4, /*kc=*/256, /*mc=*/96};
#endif
}

// at::parallel_for as gemm_core's pfor.
struct AtenFor {
  template <typename F>
  void operator()(int64_t begin, int64_t end, int64_t grain, const F& fn) const {
    at::parallel_for(begin, end, grain, fn);
  }
};
#else
inline int64_t padded(int64_t n) { return (n + 15) / 16 * 16; }
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

// The bfloat16 path of this process: an index into kBf16Paths, -1 until set (then "amx" where
// the tiles are enabled, else "fma": the choice before paths were measured).
const char* const kBf16Paths[] = {"fma", "dot", "amx"};
enum Bf16Path : int { kFma = 0, kDot = 1, kAmx = 2 };
std::atomic<int> g_bf16_path{-1};

int bf16_path() {
  const int p = g_bf16_path.load(std::memory_order_relaxed);
  if (p >= 0) return p;
  return gemm_bf16_amx_supported() ? kAmx : kFma;
}

}  // namespace

bool gemm_bf16_amx_supported() {
#if defined(RADIXKV_AMX)
  return radixkv_amx::enabled();
#else
  return false;
#endif
}

std::vector<std::string> bf16_gemm_paths() {
  std::vector<std::string> out;
  if (!gemm_bf16_supported()) return out;
  out.emplace_back(kBf16Paths[kFma]);
#if defined(__AVX512BF16__)
  out.emplace_back(kBf16Paths[kDot]);
#endif
  if (gemm_bf16_amx_supported()) out.emplace_back(kBf16Paths[kAmx]);
  return out;
}

void set_bf16_gemm(const std::string& name) {
  const auto served = bf16_gemm_paths();
  const bool ok = std::find(served.begin(), served.end(), name) != served.end();
  TORCH_CHECK(ok, "bfloat16 GEMM path '", name, "' is not served on this CPU");
  for (int i = 0; i < 3; ++i)
    if (name == kBf16Paths[i]) g_bf16_path.store(i);
}

std::string bf16_gemm() { return gemm_bf16_supported() ? kBf16Paths[bf16_path()] : ""; }

bool gemm_f32_supported() {
#if defined(RADIXKV_AVX512)
  return true;
#else
  return false;
#endif
}

bool gemm_bf16_amx() { return gemm_bf16_supported() && bf16_path() == kAmx; }

bool gemm_bf16_supported() {
#if defined(RADIXKV_AVX512)
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
    return wp.view({np / 16, 16, k / 2, 2}).permute({0, 2, 1, 3}).contiguous();
  }
  TORCH_CHECK(w.scalar_type() == torch::kFloat, "float32 or bfloat16 weights only");
  return wp.view({np / 16, 16, k}).transpose(1, 2).contiguous();
}

// x [M, K] (contiguous) times the packed W [N, K] -> [M, N] in x's dtype; bias f32 [N] or none.
torch::Tensor gemm(torch::Tensor x, torch::Tensor packed, int64_t n,
                   c10::optional<torch::Tensor> bias) {
  const int64_t m_rows = x.size(0), k = x.size(1);
  auto out = torch::empty({m_rows, n}, x.options());
  const float* bp = bias ? bias->data_ptr<float>() : nullptr;
  if (m_rows == 0) return out;
  if (x.scalar_type() == torch::kFloat) {
#if defined(RADIXKV_AVX512)
    check(x, packed, n, bias, torch::kFloat);
    radixkv_gemm::run<F32Ops, float>(blocking(m_rows), x.data_ptr<float>(), m_rows, k,
                                     packed.data_ptr<float>(), n, bp, out.data_ptr<float>(),
                                     AtenFor{});
    return out;
#endif
  } else if (x.scalar_type() == torch::kBFloat16) {
#if defined(RADIXKV_AVX512)
    check(x, packed, n, bias, torch::kBFloat16);
    TORCH_CHECK(k % 2 == 0, "bf16 gemm needs an even number of in features");
    const int path = bf16_path();
    (void)path;  // unused where neither the tiles nor VDPBF16PS are built
#if defined(RADIXKV_AMX)
    if (path == kAmx && k % 32 == 0) {  // per weight (its K), never per call
      radixkv_amx::gemm(reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>()), m_rows, k,
                        reinterpret_cast<const uint32_t*>(packed.data_ptr<c10::BFloat16>()), n,
                        bp, reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>()),
                        AtenFor{}, at::get_num_threads());
      return out;
    }
#endif
    const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>());
    const auto* wp = reinterpret_cast<const uint32_t*>(packed.data_ptr<c10::BFloat16>());
    auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
#if defined(__AVX512BF16__)
    if (path == kDot) {
      radixkv_gemm::run<BF16DotOps, uint16_t>(blocking(m_rows, n, true), xp, m_rows, k / 2, wp, n,
                                              bp, op, AtenFor{});
      return out;
    }
#endif
    radixkv_gemm::run<BF16Ops, uint16_t>(blocking(m_rows), xp, m_rows, k / 2, wp, n, bp, op,
                                         AtenFor{});
    return out;
#endif
  }
  TORCH_CHECK(false, "gemm: unsupported dtype or CPU (", x.scalar_type(), ")");
}

// The gate/up product fused with silu_mul, on AMX only (bf16, K % 32 == 0, n % 32 == 0):
// `packed` is gemm_pack of [gate; up] ([n, K], n = 2 * I) with its 16-output blocks reordered as
// gate block 0, up block 0, gate block 1, ... (and `bias`, if any, likewise); returns
// silu(gate) * up [M, I], the bits of gemm() followed by silu_mul.
torch::Tensor gemm_silu(torch::Tensor x, torch::Tensor packed, int64_t n,
                        c10::optional<torch::Tensor> bias) {
#if defined(RADIXKV_AMX)
  check(x, packed, n, bias, torch::kBFloat16);
  const int64_t m_rows = x.size(0), k = x.size(1);
  TORCH_CHECK(k % 32 == 0 && n % 32 == 0 && gemm_bf16_amx(),
              "gemm_silu: AMX, K and n multiples of 32");
  auto out = torch::empty({m_rows, n / 2}, x.options());
  if (m_rows == 0) return out;
  radixkv_amx::gemm(reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>()), m_rows, k,
                    reinterpret_cast<const uint32_t*>(packed.data_ptr<c10::BFloat16>()), n,
                    bias ? bias->data_ptr<float>() : nullptr,
                    reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>()), AtenFor{},
                    at::get_num_threads(), /*silu=*/true);
  return out;
#else
  TORCH_CHECK(false, "gemm_silu needs AMX");
  return x;
#endif
}

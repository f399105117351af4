// The Python module of radixkv's C++ CPU kernels (built by radixkv.model.kernels).
#include <torch/extension.h>

torch::Tensor decode_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                               torch::Tensor slots, torch::Tensor lens, double scale);
bool extend_attention_supported();
torch::Tensor extend_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                               torch::Tensor slots, torch::Tensor ctx_start, torch::Tensor q_start,
                               torch::Tensor new_len, torch::Tensor prefix, int64_t window,
                               double scale);
bool small_gemm_f32_supported();
bool small_gemm_bf16_supported();
torch::Tensor small_gemm_pack(torch::Tensor w);
torch::Tensor small_gemm(torch::Tensor x, torch::Tensor packed, int64_t n,
                         c10::optional<torch::Tensor> bias);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &decode_attention,
        "One-query decode attention reading K/V from the pool by slot (f32 accumulation)");
  m.def("extend_attention_supported", &extend_attention_supported);
  m.def("extend_attention", &extend_attention,
        "Causal (windowed) attention of new tokens to their context read from the pool by slot");
  m.def("small_gemm_f32_supported", &small_gemm_f32_supported);
  m.def("small_gemm_bf16_supported", &small_gemm_bf16_supported);
  m.def("small_gemm_pack", &small_gemm_pack, "Repack W [N, K] for small_gemm");
  m.def("small_gemm", &small_gemm, "x [M, K] @ packed W^T (+ f32 bias) for small M");
}

// The Python module of radixkv's C++ CPU kernels (built by radixkv.model.kernels).
#include <torch/extension.h>

#include "kernels.h"


PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &decode_attention,
        "One-query decode attention reading K/V from the pool by slot (f32 accumulation)");
  m.def("extend_attention_supported", &extend_attention_supported);
  m.def("extend_attention", &extend_attention,
        "Causal (windowed) attention of new tokens to their context read from the pool by slot");
  m.def("rms_norm", &rms_norm, "RMSNorm over the last dim (f32 statistics, fixed order)");
  m.def("rms_norm_1p", &rms_norm_1p, "RMSNorm times (1 + weight) in f32 (Gemma 3, Qwen3.5)");
  m.def("silu_mul", &silu_mul, "silu(gate) * up over the halves of the last dim");
  m.def("gelu_tanh_mul", &gelu_tanh_mul, "gelu_tanh(gate) * up over the halves of the last dim");
  m.def("rope", &rope, "Rotary embedding per half, [T, H, D] with cos/sin [T, D]");
  m.def("gemm_f32_supported", &gemm_f32_supported);
  m.def("gemm_bf16_supported", &gemm_bf16_supported);
  m.def("gemm_bf16_amx", &gemm_bf16_amx);
  m.def("gemm_bf16_amx_supported", &gemm_bf16_amx_supported);
  m.def("bf16_gemm_paths", &bf16_gemm_paths, "The bfloat16 GEMM paths this CPU serves");
  m.def("set_bf16_gemm", &set_bf16_gemm, "Choose this process's bfloat16 GEMM path (once)");
  m.def("bf16_gemm", &bf16_gemm, "This process's bfloat16 GEMM path");
  m.def("gemm_pack", &gemm_pack, "Repack W [N, K] for gemm (N padded to 16)");
  m.def("gemm", &gemm, "x [M, K] @ packed W^T (+ f32 bias), row-invariant reduction order");
  m.def("gemm_silu", &gemm_silu, "silu(gate) * up of x @ [gate; up]^T, blocks interleaved (AMX)");
  m.def("gated_delta_rule", &gated_delta_rule,
        "Gated DeltaNet token by token over runs of sequences, states in place (deltanet.cpp)");
  bind_stack(m);
}

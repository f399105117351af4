// The C++ entry points of radixkv's CPU kernels, one declaration each: bindings.cpp exposes them
// to Python, stack.cpp calls them from its loop over the layers.
#pragma once

#include <torch/extension.h>

torch::Tensor decode_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                               torch::Tensor slots, torch::Tensor lens, int64_t window,
                               double scale);
bool extend_attention_supported();
torch::Tensor extend_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                               torch::Tensor slots, torch::Tensor ctx_start, torch::Tensor q_start,
                               torch::Tensor new_len, torch::Tensor prefix, int64_t window,
                               double scale);
bool gemm_f32_supported();
bool gemm_bf16_supported();
bool gemm_bf16_amx();
torch::Tensor gemm_pack(torch::Tensor w);
torch::Tensor gemm(torch::Tensor x, torch::Tensor packed, int64_t n,
                   c10::optional<torch::Tensor> bias);
torch::Tensor gemm_silu(torch::Tensor x, torch::Tensor packed, int64_t n,
                        c10::optional<torch::Tensor> bias);
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);
torch::Tensor silu_mul(torch::Tensor gate_up);
torch::Tensor rope(torch::Tensor x, torch::Tensor cos, torch::Tensor sin);
void bind_stack(pybind11::module& m);  // stack.cpp: the DecoderStack class

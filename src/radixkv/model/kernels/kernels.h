// The C++ entry points of radixkv's CPU kernels, one declaration each: bindings.cpp exposes them
// to Python, stack.cpp calls them from its loop over the layers.
#pragma once

#include <torch/extension.h>

#include <string>
#include <vector>

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
bool gemm_bf16_amx();            // this process's bfloat16 path is the AMX tiles
bool gemm_bf16_amx_supported();  // the tiles are built and enabled on this CPU
std::vector<std::string> bf16_gemm_paths();  // the bfloat16 GEMM paths this CPU serves
void set_bf16_gemm(const std::string& name);  // once, before any product
std::string bf16_gemm();                      // this process's bfloat16 path ("" if none)
torch::Tensor gemm_pack(torch::Tensor w);
torch::Tensor gemm(torch::Tensor x, torch::Tensor packed, int64_t n,
                   c10::optional<torch::Tensor> bias);
torch::Tensor gemm_silu(torch::Tensor x, torch::Tensor packed, int64_t n,
                        c10::optional<torch::Tensor> bias);
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);
torch::Tensor rms_norm_1p(torch::Tensor x, torch::Tensor weight, double eps);
torch::Tensor silu_mul(torch::Tensor gate_up);
torch::Tensor gelu_tanh_mul(torch::Tensor gate_up);
torch::Tensor rope(torch::Tensor x, torch::Tensor cos, torch::Tensor sin);
torch::Tensor gated_delta_rule(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor g,
                               torch::Tensor beta, torch::Tensor state, torch::Tensor starts,
                               torch::Tensor lens, torch::Tensor slots, torch::Tensor fresh,
                               double scale);
void bind_stack(pybind11::module& m);  // stack.cpp: the DecoderStack class

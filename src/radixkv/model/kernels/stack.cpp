// A decoder stack in one call (radixkv.model.nn.native_stack builds it from the Python layers).
//
// Every layer's steps are the calls the Python layer (radixkv.model.nn.blocks, and the families'
// layers) makes, to the same kernels, on the same tensors, in the same order: RMSNorm (or the
// (1 + w) RMSNorm of Gemma), the fused QKV product, optional per-head Q/K norms, RoPE, the pool
// write (index_copy_), attention (the extend kernel for the multi-token requests, the decode
// kernel for the one-token ones), the output product, an optional norm of the block's output
// (Gemma's sandwich norms) and the residual add (at::add, torch's own kernel), then the MLP
// (SiLU or GELU-tanh). So every output bit is the Python path's; what the stack removes is the
// interpreter and the dispatcher between the ~20-30 calls of a layer, which on the default model
// took about a third of a decode step. A layer reads and writes one KV component (FULL or SWA):
// its RoPE table, out slots and attention metadata are that component's.
#include <torch/extension.h>

#include <cstdint>
#include <vector>

#include "kernels.h"

namespace {

// One projection as PackedLinear holds it: the packed weight, the product's output count (both
// halves when fused with SiLU), its f32 bias, and whether silu(gate) * up is fused in.
struct Proj {
  torch::Tensor w;
  int64_t n;
  c10::optional<torch::Tensor> bias;
  bool silu;

  // PackedLinear.__call__ on x [M, K] (contiguous).
  torch::Tensor operator()(const torch::Tensor& x) const {
    return silu ? gemm_silu(x, w, n, bias) : gemm(x, w, n, bias);
  }
};

struct Layer {
  torch::Tensor in_norm, post_norm;               // before attention, before the MLP
  c10::optional<torch::Tensor> q_norm, k_norm;    // per-head RMSNorm before RoPE (Qwen3, Gemma)
  c10::optional<torch::Tensor> attn_out_norm, mlp_out_norm;  // of each block's output (Gemma)
  Proj qkv, o, gate_up, down;
  int64_t window;  // 0: none
  bool one_plus;   // every norm of the layer scales by (1 + w) (Gemma)
  bool gelu;       // the MLP is gelu_tanh(gate) * up, else silu(gate) * up
  int64_t comp;    // the KV component: index into forward's per-component arguments
};

// The attention metadata of one forward (radixkv.model.attention_meta), as the kernels take it:
// the one-token requests' rows, padded context slots and lengths; the multi-token requests'
// packed arguments. Either part may be absent.
struct Meta {
  c10::optional<torch::Tensor> dec_rows, dec_slots, dec_lens;
  std::vector<torch::Tensor> ext;  // slots, ctx_start, q_start, new_len, prefix (or empty)
};

class DecoderStack {
 public:
  DecoderStack(int64_t heads, int64_t kv_heads, int64_t head_dim, double eps, double scale)
      : H_(heads), KV_(kv_heads), D_(head_dim), eps_(eps), scale_(scale) {}

  // weights / outs / biases: qkv, o, gate_up, down. norms: in, post, then optional q, k,
  // attention-output and MLP-output norms. flags: one_plus, gelu, mlp_silu_fused.
  void add_layer(std::vector<c10::optional<torch::Tensor>> norms, std::vector<torch::Tensor> weights,
                 std::vector<int64_t> outs, std::vector<c10::optional<torch::Tensor>> biases,
                 std::vector<bool> flags, int64_t window, int64_t comp) {
    TORCH_CHECK(weights.size() == 4 && outs.size() == 4 && biases.size() == 4,
                "add_layer: qkv, o, gate_up, down");
    TORCH_CHECK(norms.size() == 6 && norms[0] && norms[1], "add_layer: six norms, two required");
    TORCH_CHECK(flags.size() == 3 && comp >= 0, "add_layer: three flags, a component");
    TORCH_CHECK(!(flags[1] && flags[2]), "add_layer: SiLU fused into a GELU MLP");
    layers_.push_back(Layer{*norms[0], *norms[1], norms[2], norms[3], norms[4], norms[5],
                            Proj{weights[0], outs[0], biases[0], false},
                            Proj{weights[1], outs[1], biases[1], false},
                            Proj{weights[2], outs[2], biases[2], flags[2]},
                            Proj{weights[3], outs[3], biases[3], false}, window, flags[0],
                            flags[1], comp});
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

  // x [T, hidden] -> x after every layer. k_pools[i] / v_pools[i]: layer i's pool tensors
  // [slots, KV, D] in x's dtype. Per KV component c (a layer's `comp`): its RoPE table
  // (cos[c], sin[c]), where this step's K/V go (out_slots[c]), and its attention metadata: the
  // one-token requests' rows, slot rows and lengths (all None when it has none), and the packed
  // extend arguments (5 tensors, or none).
  torch::Tensor forward(torch::Tensor x, const std::vector<torch::Tensor>& cos,
                        const std::vector<torch::Tensor>& sin,
                        const std::vector<torch::Tensor>& k_pools,
                        const std::vector<torch::Tensor>& v_pools,
                        const std::vector<torch::Tensor>& out_slots,
                        const std::vector<c10::optional<torch::Tensor>>& dec_rows,
                        const std::vector<c10::optional<torch::Tensor>>& dec_slots,
                        const std::vector<c10::optional<torch::Tensor>>& dec_lens,
                        const std::vector<std::vector<torch::Tensor>>& ext) {
    TORCH_CHECK(k_pools.size() == layers_.size() && v_pools.size() == layers_.size(),
                "one K and one V pool per layer");
    const size_t n = cos.size();
    TORCH_CHECK(sin.size() == n && out_slots.size() == n && dec_rows.size() == n &&
                    dec_slots.size() == n && dec_lens.size() == n && ext.size() == n,
                "one of each per-component argument per component");
    std::vector<Meta> metas;
    for (size_t c = 0; c < n; ++c) {
      TORCH_CHECK(ext[c].empty() || ext[c].size() == 5, "extend metadata: 5 tensors or none");
      TORCH_CHECK(!ext[c].empty() || (dec_slots[c] && dec_lens[c]), "a forward with no requests");
      metas.push_back(Meta{dec_rows[c], dec_slots[c], dec_lens[c], ext[c]});
    }
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& L = layers_[i];
      TORCH_CHECK(static_cast<size_t>(L.comp) < n, "layer ", i, ": no such KV component");
      const size_t c = static_cast<size_t>(L.comp);
      torch::Tensor h = attention(L, norm(L, x, L.in_norm), cos[c], sin[c], k_pools[i],
                                  v_pools[i], out_slots[c], metas[c]);
      if (L.attn_out_norm) h = norm(L, h, *L.attn_out_norm);
      x = at::add(x, h);
      h = mlp(L, norm(L, x, L.post_norm));
      if (L.mlp_out_norm) h = norm(L, h, *L.mlp_out_norm);
      x = at::add(x, h);
    }
    return x;
  }

 private:
  // Attention.forward: h [T, hidden] (normed) -> the block's output [T, hidden].
  torch::Tensor attention(const Layer& L, const torch::Tensor& h, const torch::Tensor& cos,
                          const torch::Tensor& sin, torch::Tensor k_pool, torch::Tensor v_pool,
                          const torch::Tensor& out_slots, const Meta& meta) const {
    const int64_t t = h.size(0), q_size = H_ * D_, kv_size = KV_ * D_;
    const torch::Tensor qkv = L.qkv(h.contiguous());
    torch::Tensor q = qkv.narrow(1, 0, q_size).view({t, H_, D_});
    torch::Tensor k = qkv.narrow(1, q_size, kv_size).view({t, KV_, D_});
    const torch::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({t, KV_, D_});
    if (L.q_norm && L.k_norm) {
      q = norm(L, q, *L.q_norm);
      k = norm(L, k, *L.k_norm);
    }
    q = rope(q, cos, sin);
    k = rope(k, cos, sin);
    // Invariant: this step's K/V are in the pool before attention reads the context by slot.
    k_pool.index_copy_(0, out_slots, k);
    v_pool.index_copy_(0, out_slots, v);
    torch::Tensor out;
    if (meta.ext.empty()) {
      out = decode_attention(q, k_pool, v_pool, *meta.dec_slots, *meta.dec_lens, L.window, scale_);
    } else {
      const auto& e = meta.ext;
      out = extend_attention(q, k_pool, v_pool, e[0], e[1], e[2], e[3], e[4], L.window, scale_);
      if (meta.dec_rows) {  // the one-token requests' rows, left unset by the extend kernel
        const torch::Tensor dec =
            decode_attention(q.index_select(0, *meta.dec_rows), k_pool, v_pool, *meta.dec_slots,
                             *meta.dec_lens, L.window, scale_);
        out.index_copy_(0, *meta.dec_rows, dec);
      }
    }
    return L.o(out.reshape({t, q_size}).contiguous());
  }

  // The layer's RMSNorm: rms_norm, or rms_norm_1p for a (1 + w) layer.
  torch::Tensor norm(const Layer& L, const torch::Tensor& x, const torch::Tensor& w) const {
    return L.one_plus ? rms_norm_1p(x, w, eps_) : rms_norm(x, w, eps_);
  }

  // GatedMLP.forward: down(act(gate) * up), a SiLU fused into the product or not.
  torch::Tensor mlp(const Layer& L, const torch::Tensor& h) const {
    torch::Tensor act = L.gate_up(h.contiguous());
    if (L.gelu) {
      act = gelu_tanh_mul(act);
    } else if (!L.gate_up.silu) {
      act = silu_mul(act);
    }
    return L.down(act.contiguous());
  }

  int64_t H_, KV_, D_;
  double eps_, scale_;
  std::vector<Layer> layers_;
};

}  // namespace

void bind_stack(pybind11::module& m) {
  namespace py = pybind11;
  py::class_<DecoderStack>(m, "DecoderStack")
      .def(py::init<int64_t, int64_t, int64_t, double, double>())
      .def("add_layer", &DecoderStack::add_layer)
      .def("num_layers", &DecoderStack::num_layers)
      .def("forward", &DecoderStack::forward, py::call_guard<py::gil_scoped_release>());
}

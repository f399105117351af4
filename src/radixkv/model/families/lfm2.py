"""LFM2 (`Lfm2ForCausalLM`): gated short-convolution layers beside full attention.

A conv layer computes B, C, x = in_proj(h), then y = C * conv(B * x) with a depthwise causal conv
of kernel L (`conv_L_cache`); its state is the last L-1 inputs of the conv ([hidden, L-1] per
sequence, in the StatePool). Attention layers are Llama-like with per-head Q/K RMSNorm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from radixkv.memory.state_pool import StateLayerSpec, StateTensorSpec
from radixkv.model.attention import AttentionBackend
from radixkv.model.config import (
    ModelConfig,
    UnsupportedArchitectureError,
    _parse_rope,
    kind_indices,
)
from radixkv.model.families.skeleton import Forward
from radixkv.model.families.state_layers import RopeState, RopeStateLM, causal_conv
from radixkv.model.nn.blocks import Attention, AttentionSpec, GatedMLP, WeightGetter, Weights
from radixkv.model.nn.layers import rms_norm


@dataclass(frozen=True)
class Lfm2Config(ModelConfig):
    rope_theta: float = 1_000_000.0
    conv_kernel: int = 3
    conv_bias: bool = False

    @classmethod
    def from_dict(cls, raw: dict[str, Any], gen: dict[str, Any] | None = None) -> Lfm2Config:
        raw = dict(raw)
        if raw.get("layer_types") is None:
            n = int(raw["num_hidden_layers"])
            idxs = raw.get("full_attn_idxs")
            full = set(range(n)) if idxs is None else set(idxs)
            raw["layer_types"] = ["full_attention" if i in full else "conv" for i in range(n)]
        theta, scaling = _parse_rope(raw, "Lfm2ForCausalLM")
        if scaling is not None:
            raise UnsupportedArchitectureError("Lfm2ForCausalLM: rope scaling is not supported")
        return cls(
            **cls.common(
                raw,
                gen,
                tie_word_embeddings=bool(
                    raw.get("tie_word_embeddings", raw.get("tie_embedding", True))
                ),
                sliding_window=None,
                rms_norm_eps=float(raw.get("norm_eps", 1e-5)),
            ),
            rope_theta=theta,
            conv_kernel=int(raw.get("conv_L_cache", 3)),
            conv_bias=bool(raw.get("conv_bias", False)),
        )

    def state_layer_specs(self) -> tuple[StateLayerSpec, ...]:
        conv = StateTensorSpec("conv", (self.hidden_size, self.conv_kernel - 1))
        return tuple(StateLayerSpec((conv,)) for _ in range(self.count("state")))


class Lfm2Layer(nn.Module):
    def __init__(self, cfg: Lfm2Config, index: int, w: Weights) -> None:
        super().__init__()
        self.kind = cfg.layer_kinds[index]
        self.pool_layer = kind_indices(cfg.layer_kinds)[index]
        self.eps = cfg.rms_norm_eps
        self.op_norm = w.need("operator_norm.weight")
        self.ffn_norm = w.need("ffn_norm.weight")
        self.mlp = GatedMLP(w.sub("feed_forward."), names=("w1", "w3", "w2"))
        self.attn: Attention | None = None
        if self.kind == "state":
            c = w.sub("conv.")
            self.in_proj = c.linear("in_proj", bias=None)
            self.conv_w = nn.Parameter(c.need("conv.weight")[:, 0, :].contiguous(), False)
            self.conv_b = c.maybe("conv.bias")
            self.out_proj = c.linear("out_proj", bias=None)
        else:
            spec = AttentionSpec(
                cfg.num_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.rms_norm_eps,
                qk_norm="rms",
                q_norm="q_layernorm",
                k_norm="k_layernorm",
                o_proj="out_proj",
            )
            self.attn = Attention(spec, index, w.sub("self_attn."))

    def _conv(self, h: torch.Tensor, fwd: Forward[RopeState]) -> torch.Tensor:
        b, c, x = self.in_proj(h).chunk(3, dim=-1)
        pool = None if fwd.pools is None else fwd.pools.state()
        assert pool is not None
        conv_state = pool.tensors[self.pool_layer]["conv"]
        y = c * causal_conv(b * x, conv_state, fwd.prep.meta(), self.conv_w, self.conv_b)
        return self.out_proj(y)

    def forward(self, x: torch.Tensor, fwd: Forward[RopeState]) -> torch.Tensor:
        h = rms_norm(x, self.op_norm, self.eps)
        if self.attn is None:
            x = x + self._conv(h, fwd)
        else:
            x = x + self.attn(h, fwd.prep.cos, fwd.prep.sin, fwd.kv)
        return x + self.mlp(rms_norm(x, self.ffn_norm, self.eps), fwd.kv)


class Lfm2LM(RopeStateLM):
    layer_cls = Lfm2Layer
    final_norm_weight = "model.embedding_norm.weight"

    def __init__(
        self,
        cfg: Lfm2Config,
        get: WeightGetter,
        device: str = "cpu",
        attention: AttentionBackend | None = None,
    ) -> None:
        if "swa" in cfg.layer_kinds:
            raise UnsupportedArchitectureError("Lfm2ForCausalLM: sliding layers are not supported")
        super().__init__(cfg, get, device, attention)
        self.init_rope(cfg.head_dim, cfg.rope_theta, device)

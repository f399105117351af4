"""The Llama family (Llama/SmolLM2, Qwen2, Qwen3, Mistral): the skeleton's standard layers.

Family differences are config flags (radixkv.model.config.LlamaConfig): Q/K/V bias (Qwen2),
per-head Q/K RMSNorm before RoPE (Qwen3), per-layer sliding windows (Mistral), tied embeddings.
Q/K/V and gate/up projections are fused into one matmul each at load time; names of the fused
parameters are ours, the loader maps HF names. Every layer is the standard `DecoderLayer`, so
the native C++ stack and the compiled path serve the family.
"""

from __future__ import annotations

from typing import cast

import torch

from radixkv.memory.hybrid import ModelPools
from radixkv.model.attention import AttentionBackend
from radixkv.model.batch import ForwardBatch
from radixkv.model.config import LlamaConfig, ModelConfig
from radixkv.model.families.skeleton import DecoderLayer, DecoderLM, Rope
from radixkv.model.nn.blocks import AttentionSpec, LayerOps, WeightGetter, Weights
from radixkv.model.nn.layers import rope_cos_sin, rope_inv_freq

__all__ = ["CausalLM", "DecoderLayer", "LayerOps", "WeightGetter", "attention_spec"]


def attention_spec(cfg: LlamaConfig) -> AttentionSpec:
    """The family's attention: optional Q/K/V and output biases, optional per-head Q/K norm."""
    return AttentionSpec(
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.rms_norm_eps,
        qkv_bias=cfg.qkv_bias,
        o_bias=cfg.o_bias,
        qk_norm="rms" if cfg.qk_norm else None,
    )


class CausalLM(DecoderLM[Rope]):
    """A Llama-family model: `model(batch, pools)` → float32 logits (see DecoderLM)."""

    config: LlamaConfig

    def __init__(
        self,
        cfg: LlamaConfig,
        get: WeightGetter,
        device: str = "cpu",
        attention: AttentionBackend | None = None,
    ) -> None:
        super().__init__(cfg, get, device, attention)
        self.inv_freq: torch.Tensor
        inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling_dict)
        self.register_buffer("inv_freq", inv.to(device), persistent=False)

    def make_layer(self, cfg: ModelConfig, index: int, w: Weights) -> DecoderLayer:
        assert isinstance(cfg, LlamaConfig)
        return DecoderLayer(
            attention_spec(cfg), index, w, window=cfg.layer_window(index), mlp_bias=cfg.mlp_bias
        )

    @property
    def decoder_layers(self) -> list[DecoderLayer]:
        return [cast(DecoderLayer, layer) for layer in self.layers]

    def prepare(self, batch: ForwardBatch, pools: ModelPools | None) -> Rope:
        return Rope(*rope_cos_sin(batch.positions, self.inv_freq, self.dtype))

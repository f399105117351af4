"""A test-only model family that lives outside radixkv.model.families: what adding a family takes
is this module (a config, its layers, its model class) plus one registry line
(tests/model/test_toy_family.py adds it to radixkv.model.registry.ARCHITECTURES).

Two architectures:
- `ToyForCausalLM`: the skeleton's standard pre-norm layer (per-head Q/K RMSNorm, SiLU MLP),
  optionally sliding-window layers via HF `layer_types`; it must pick up the native C++ stack and
  the compiled path without a line elsewhere.
- `ToyParallelForCausalLM`: a twist, GPT-J / Falcon-style parallel blocks (attention and MLP
  both read the same normed input, x + attn(n(x)) + mlp(n2(x))); a layer that overrides `block`
  is not stackable, so it runs eagerly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from radixkv.memory.hybrid import ModelPools
from radixkv.model.batch import ForwardBatch
from radixkv.model.config import ModelConfig
from radixkv.model.families.skeleton import DecoderLayer, DecoderLM, Rope
from radixkv.model.nn.blocks import AttentionSpec, LayerOps, Weights
from radixkv.model.nn.layers import rms_norm, rope_cos_sin, rope_inv_freq


@dataclass(frozen=True)
class ToyConfig(ModelConfig):
    intermediate_size: int = 0
    rope_theta: float = 10_000.0

    @classmethod
    def from_dict(cls, raw: dict[str, Any], gen: dict[str, Any] | None = None) -> ToyConfig:
        return cls(
            **cls.common(raw, gen),
            intermediate_size=int(raw["intermediate_size"]),
            rope_theta=float(raw.get("rope_theta", 10_000.0)),
        )


class ToyLayer(DecoderLayer):
    """The standard layer, built from the toy config."""

    def __init__(self, cfg: ToyConfig, index: int, w: Weights) -> None:
        spec = AttentionSpec(
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps, qk_norm="rms"
        )
        super().__init__(spec, index, w, window=cfg.layer_window(index))


class ToyParallelLayer(ToyLayer):
    """Attention and MLP side by side on the same input."""

    def block(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ops: LayerOps
    ) -> torch.Tensor:
        a = self.attn(rms_norm(x, self.input_norm, self.eps), cos, sin, ops)
        return x + a + self.mlp(rms_norm(x, self.post_norm, self.eps), ops)


class ToyLM(DecoderLM[Rope]):
    layer_cls = ToyLayer

    def __init__(self, cfg: ToyConfig, get: Any, device: str = "cpu", attention: Any = None):
        super().__init__(cfg, get, device, attention)
        self.inv_freq: torch.Tensor
        inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, None).to(device)
        self.register_buffer("inv_freq", inv, persistent=False)

    def prepare(self, batch: ForwardBatch, pools: ModelPools | None) -> Rope:
        return Rope(*rope_cos_sin(batch.positions, self.inv_freq, self.dtype))


class ToyParallelLM(ToyLM):
    layer_cls = ToyParallelLayer

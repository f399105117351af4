"""Gemma 3 text (`Gemma3ForCausalLM`): sliding-window layers beside full-attention layers.

Sliding layers use the SWA pool and a local RoPE base; full layers the FULL pool and a global base
(optionally linearly scaled). Per-head Q/K RMSNorm, (1 + w) norms, four norms per block (pre and
post attention, pre and post MLP), GELU-tanh MLP, embeddings scaled by sqrt(hidden), attention
scale `query_pre_attn_scalar ** -0.5`, optional final logit soft-capping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from radixkv.memory.hybrid import ModelPools
from radixkv.model.attention import AttentionBackend
from radixkv.model.batch import ForwardBatch
from radixkv.model.config import ModelConfig, UnsupportedArchitectureError, _parse_rope
from radixkv.model.families.skeleton import DecoderLM, Forward, Rope
from radixkv.model.nn.blocks import Attention, AttentionSpec, GatedMLP, WeightGetter, Weights
from radixkv.model.nn.layers import rms_norm_1p, rope_cos_sin, rope_inv_freq
from radixkv.model.nn.native_stack import NativeLayer

ARCH = "Gemma3ForCausalLM"
_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu")


@dataclass(frozen=True)
class Gemma3Config(ModelConfig):
    # (theta, scaling) per kind: "full" uses the global base, "swa" the local one.
    rope_full: tuple[float, tuple[tuple[str, Any], ...] | None] = (1_000_000.0, None)
    rope_swa: tuple[float, tuple[tuple[str, Any], ...] | None] = (10_000.0, None)
    query_pre_attn_scalar: float = 256.0
    final_logit_softcapping: float | None = None
    activation: str = "gelu_pytorch_tanh"

    @classmethod
    def from_dict(cls, raw: dict[str, Any], gen: dict[str, Any] | None = None) -> Gemma3Config:
        if raw.get("use_bidirectional_attention"):
            raise UnsupportedArchitectureError(f"{ARCH}: bidirectional attention is not supported")
        if raw.get("attn_logit_softcapping") is not None:
            raise UnsupportedArchitectureError(
                f"{ARCH}: attention logit soft-capping is not supported"
            )
        raw = dict(raw)
        if raw.get("layer_types") is None:
            pattern = int(raw.get("sliding_window_pattern", 6))
            raw["layer_types"] = [
                "sliding_attention" if (i + 1) % pattern else "full_attention"
                for i in range(int(raw["num_hidden_layers"]))
            ]
        act = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in _ACTIVATIONS:
            raise UnsupportedArchitectureError(f"{ARCH}: unsupported activation {act!r}")
        full, local = _rope_params(raw)
        cap = raw.get("final_logit_softcapping")
        return cls(
            **cls.common(raw, gen, tie_word_embeddings=bool(raw.get("tie_word_embeddings", True))),
            rope_full=full,
            rope_swa=local,
            query_pre_attn_scalar=float(raw.get("query_pre_attn_scalar", 256)),
            final_logit_softcapping=None if cap is None else float(cap),
            activation=act,
        )

    @property
    def attn_scale(self) -> float:
        return float(self.query_pre_attn_scalar**-0.5)

    @property
    def embed_scale(self) -> float | None:
        return float(self.hidden_size**0.5)

    @property
    def final_softcap(self) -> float | None:
        return self.final_logit_softcapping


def _rope_params(
    raw: dict[str, Any],
) -> tuple[tuple[float, Any], tuple[float, Any]]:
    """(theta, scaling items) for full and sliding layers, from v5 per-type `rope_parameters` or
    the legacy `rope_theta` / `rope_local_base_freq` / `rope_scaling` fields."""
    params = raw.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        full = dict(params.get("full_attention") or {})
        local = dict(params.get("sliding_attention") or {})
    else:
        full = dict(raw.get("rope_scaling") or {})
        local = {}
    full.setdefault("rope_theta", raw.get("rope_theta", 1_000_000.0))
    local.setdefault("rope_theta", raw.get("rope_local_base_freq", 10_000.0))
    out = []
    for p in (full, local):
        theta, scaling = _parse_rope({"rope_parameters": p}, ARCH)
        out.append((theta, None if scaling is None else tuple(sorted(scaling.items()))))
    return out[0], out[1]


@dataclass(frozen=True)
class Gemma3Ropes:
    """This step's RoPE tables: the global base's for full layers, the local base's for sliding
    ones (None for a kind the model does not have)."""

    full: Rope | None
    swa: Rope | None

    def of(self, kind: str) -> Rope:
        rope = self.swa if kind == "swa" else self.full
        assert rope is not None
        return rope


class Gemma3Layer(nn.Module):
    """Pre- and post-norms around both attention and MLP, all (1 + w) RMSNorms; GELU MLP."""

    def __init__(self, cfg: Gemma3Config, index: int, w: Weights) -> None:
        super().__init__()
        self.kind = cfg.layer_kinds[index]
        self.eps = cfg.rms_norm_eps
        self.norms = nn.ParameterList(
            w.need(f"{n}.weight")
            for n in (
                "input_layernorm",
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
            )
        )
        spec = AttentionSpec(
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.rms_norm_eps,
            qkv_bias=None,  # attention_bias checkpoints carry them
            o_bias=None,
            qk_norm="rms_1p",
        )
        self.attn = Attention(spec, index, w.sub("self_attn."))
        act = "gelu_tanh" if cfg.activation == "gelu_pytorch_tanh" else "gelu"
        self.mlp = GatedMLP(w.sub("mlp."), act=act)

    def native_layer(self) -> NativeLayer:
        """The native C++ stack's form of this layer: (1 + w) norms before and after each block."""
        n_in, n_post_attn, n_pre_ff, n_post_ff = self.norms
        return NativeLayer(
            self.attn, self.mlp, self.eps, n_in, n_pre_ff, n_post_attn, n_post_ff, one_plus=True
        )

    def forward(self, x: torch.Tensor, fwd: Forward[Gemma3Ropes]) -> torch.Tensor:
        n_in, n_post_attn, n_pre_ff, n_post_ff = self.norms
        rope = fwd.prep.of(self.kind)
        h = self.attn(rms_norm_1p(x, n_in, self.eps), rope.cos, rope.sin, fwd.kv)
        x = x + rms_norm_1p(h, n_post_attn, self.eps)
        h = self.mlp(rms_norm_1p(x, n_pre_ff, self.eps), fwd.kv)
        return x + rms_norm_1p(h, n_post_ff, self.eps)


class Gemma3LM(DecoderLM[Gemma3Ropes]):
    layer_cls = Gemma3Layer
    final_norm_kind = "rms_1p"

    def __init__(
        self,
        cfg: Gemma3Config,
        get: WeightGetter,
        device: str = "cpu",
        attention: AttentionBackend | None = None,
    ) -> None:
        if "state" in cfg.layer_kinds:
            raise UnsupportedArchitectureError(f"{ARCH}: recurrent layers are not supported")
        super().__init__(cfg, get, device, attention)
        self.inv_freq_full: torch.Tensor
        self.inv_freq_swa: torch.Tensor
        for kind, (theta, scaling) in (("full", cfg.rope_full), ("swa", cfg.rope_swa)):
            inv = rope_inv_freq(cfg.head_dim, theta, None if scaling is None else dict(scaling))
            self.register_buffer(f"inv_freq_{kind}", inv.to(device), persistent=False)

    def native_ropes(self, prep: Gemma3Ropes) -> dict[str, Rope]:
        return {k: r for k, r in (("full", prep.full), ("swa", prep.swa)) if r is not None}

    def prepare(self, batch: ForwardBatch, pools: ModelPools | None) -> Gemma3Ropes:
        kinds = self.config.layer_kinds
        full = swa = None
        if "full" in kinds:
            full = Rope(*rope_cos_sin(batch.positions, self.inv_freq_full, self.dtype))
        if "swa" in kinds:
            swa = Rope(*rope_cos_sin(batch.positions, self.inv_freq_swa, self.dtype))
        return Gemma3Ropes(full, swa)

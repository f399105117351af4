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

from radixkv.model.attention import AttentionBackend
from radixkv.model.config import UnsupportedArchitectureError, _parse_rope
from radixkv.model.families.hybrid import HybridConfig, HybridLM, Step
from radixkv.model.nn.blocks import Attention, AttentionSpec, GatedMLP, Weights
from radixkv.model.nn.layers import rms_norm_1p, rope_cos_sin, rope_inv_freq

ARCH = "Gemma3ForCausalLM"
_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu")


@dataclass(frozen=True)
class Gemma3Config(HybridConfig):
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


class Gemma3Layer(nn.Module):
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

    def forward(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        n_in, n_post_attn, n_pre_ff, n_post_ff = self.norms
        cos, sin = step.cache["rope_" + self.kind]
        h = self.attn(rms_norm_1p(x, n_in, self.eps), cos, sin, step.kv)
        x = x + rms_norm_1p(h, n_post_attn, self.eps)
        h = self.mlp(rms_norm_1p(x, n_pre_ff, self.eps), step.kv)
        return x + rms_norm_1p(h, n_post_ff, self.eps)


class Gemma3LM(HybridLM):
    def __init__(
        self,
        cfg: Gemma3Config,
        get: Any,
        device: str = "cpu",
        attention: AttentionBackend | None = None,
    ) -> None:
        if "state" in cfg.layer_kinds:
            raise UnsupportedArchitectureError(f"{ARCH}: recurrent layers are not supported")
        w = Weights(get)
        super().__init__(cfg, w, device, attention)
        self.layers = nn.ModuleList(
            Gemma3Layer(cfg, i, w.sub(f"model.layers.{i}.")) for i in range(cfg.num_layers)
        )
        self.norm = w.need("model.norm.weight")
        self.eps = cfg.rms_norm_eps
        self.embed_scale = cfg.hidden_size**0.5
        self.final_softcap = cfg.final_logit_softcapping
        self.attn_scale = cfg.query_pre_attn_scalar**-0.5
        self.inv_freq_full: torch.Tensor
        self.inv_freq_swa: torch.Tensor
        for kind, (theta, scaling) in (("full", cfg.rope_full), ("swa", cfg.rope_swa)):
            inv = rope_inv_freq(cfg.head_dim, theta, None if scaling is None else dict(scaling))
            self.register_buffer(f"inv_freq_{kind}", inv.to(device), persistent=False)

    def prepare(self, step: Step) -> None:
        for kind in ("full", "swa"):
            if kind in self.config.layer_kinds:
                inv = self.inv_freq_full if kind == "full" else self.inv_freq_swa
                step.cache["rope_" + kind] = rope_cos_sin(step.positions, inv, self.dtype)

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        assert self.norm is not None
        return rms_norm_1p(x, self.norm, self.eps)

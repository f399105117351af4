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
import torch.nn.functional as F
from torch import nn

from radixkv.model.attention import AttentionBackend
from radixkv.model.config import UnsupportedArchitectureError, _parse_rope
from radixkv.model.hybrid import HybridConfig, HybridLM, Step, Weights, kind_indices, rms_norm_1p
from radixkv.model.layers import apply_rope, rope_cos_sin, rope_inv_freq

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
        self.pool_layer = kind_indices(cfg.layer_kinds)[index]
        self.window = cfg.sliding_window if self.kind == "swa" else None
        self.eps = cfg.rms_norm_eps
        self.heads, self.kv_heads, self.hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = cfg.query_pre_attn_scalar**-0.5
        self.norms = nn.ParameterList(
            w.need(f"{n}.weight")
            for n in (
                "input_layernorm",
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
            )
        )
        a = w.sub("self_attn.")
        self.qkv_w = nn.Parameter(
            torch.cat([a.need(f"{n}_proj.weight") for n in "qkv"]), requires_grad=False
        )
        biases = [a.maybe(f"{n}_proj.bias") for n in "qkv"]  # attention_bias checkpoints
        self.qkv_b = None
        if all(b is not None for b in biases):
            self.qkv_b = nn.Parameter(torch.cat(biases), requires_grad=False)  # type: ignore[arg-type]
        self.o_w, self.o_b = a.need("o_proj.weight"), a.maybe("o_proj.bias")
        self.q_norm, self.k_norm = a.need("q_norm.weight"), a.need("k_norm.weight")
        m = w.sub("mlp.")
        self.gate_w, self.up_w = m.need("gate_proj.weight"), m.need("up_proj.weight")
        self.down_w = m.need("down_proj.weight")
        self.tanh = cfg.activation == "gelu_pytorch_tanh"

    def _attn(self, h: torch.Tensor, step: Step) -> torch.Tensor:
        t = h.shape[0]
        q_size, kv_size = self.heads * self.hd, self.kv_heads * self.hd
        q, k, v = F.linear(h, self.qkv_w, self.qkv_b).split([q_size, kv_size, kv_size], dim=-1)
        q = rms_norm_1p(q.reshape(t, self.heads, self.hd), self.q_norm, self.eps)
        k = rms_norm_1p(k.reshape(t, self.kv_heads, self.hd), self.k_norm, self.eps)
        cos, sin = step.cache["rope_" + self.kind]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        v = v.reshape(t, self.kv_heads, self.hd)
        o = step.kv.attend(self.kind, self.pool_layer, q, k, v, self.window, self.scale)
        return F.linear(o.reshape(t, q_size).to(h.dtype), self.o_w, self.o_b)

    def forward(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        n_in, n_post_attn, n_pre_ff, n_post_ff = self.norms
        h = self._attn(rms_norm_1p(x, n_in, self.eps), step)
        x = x + rms_norm_1p(h, n_post_attn, self.eps)
        h = rms_norm_1p(x, n_pre_ff, self.eps)
        gate = F.gelu(F.linear(h, self.gate_w), approximate="tanh" if self.tanh else "none")
        h = F.linear(gate * F.linear(h, self.up_w), self.down_w)
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

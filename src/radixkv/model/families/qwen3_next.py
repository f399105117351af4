"""Qwen3-Next (`Qwen3NextForCausalLM`): Qwen3.5's hybrid (gated DeltaNet + gated attention) with
sparse mixture-of-experts MLPs.

Differences from Qwen3.5, all handled here on top of radixkv.model.families.qwen3_5:
- the DeltaNet input projections are fused per key head (`in_proj_qkvz`, `in_proj_ba`, each key
  head's q, k, v, z rows together); they are regrouped at load time into Qwen3.5's layout;
- MLPs are sparse MoE blocks (softmax router, top-k, optionally renormalised; a shared expert
  gated by a sigmoid), except on `mlp_only_layers` and off the `decoder_sparse_step` grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from radixkv.model.families.qwen3_5 import Qwen35Config, Qwen35Layer, Qwen35LM
from radixkv.model.nn.blocks import GatedMLP, WeightGetter, Weights
from radixkv.model.nn.layers import lanewise

ARCH = "Qwen3NextForCausalLM"


@dataclass(frozen=True)
class Qwen3NextConfig(Qwen35Config):
    num_experts: int = 0
    top_k: int = 1
    norm_topk_prob: bool = True
    sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    @classmethod
    def from_dict(cls, raw: dict[str, Any], gen: dict[str, Any] | None = None) -> Qwen3NextConfig:
        return cls(
            **cls.parse(raw, gen, ARCH),
            num_experts=int(raw.get("num_experts", 0)),
            top_k=int(raw.get("num_experts_per_tok", 1)),
            norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
            sparse_step=int(raw.get("decoder_sparse_step", 1)),
            mlp_only_layers=tuple(int(i) for i in raw.get("mlp_only_layers") or ()),
        )

    def is_sparse(self, index: int) -> bool:
        return (
            index not in self.mlp_only_layers
            and self.num_experts > 0
            and (index + 1) % self.sparse_step == 0
        )


def regrouped(get: WeightGetter, cfg: Qwen3NextConfig) -> WeightGetter:
    """A getter that also serves Qwen3.5's `in_proj_qkv` / `in_proj_z` / `in_proj_b` / `in_proj_a`
    names, cut out of Qwen3-Next's per-key-head fused projections."""
    r = cfg.v_heads // cfg.k_heads
    qkvz_parts = [cfg.k_dim, cfg.k_dim, r * cfg.v_dim, r * cfg.v_dim]

    def split(name: str, parts: list[int]) -> list[torch.Tensor]:
        t = get(name)
        if t is None:
            raise KeyError(f"checkpoint is missing {name}")
        grouped = t.view(cfg.k_heads, sum(parts), t.shape[-1])
        return [p.reshape(-1, t.shape[-1]) for p in grouped.split(parts, dim=1)]

    def getter(name: str) -> torch.Tensor | None:
        base, _, leaf = name.rpartition("linear_attn.")
        if not _:
            return get(name)
        if leaf in ("in_proj_qkv.weight", "in_proj_z.weight"):
            q, k, v, z = split(base + "linear_attn.in_proj_qkvz.weight", qkvz_parts)
            return torch.cat([q, k, v]) if leaf == "in_proj_qkv.weight" else z
        if leaf in ("in_proj_b.weight", "in_proj_a.weight"):
            b, a = split(base + "linear_attn.in_proj_ba.weight", [r, r])
            return b if leaf == "in_proj_b.weight" else a
        return get(name)

    return getter


class SparseMoE(nn.Module):
    """Top-k routed experts plus a sigmoid-gated shared expert."""

    def __init__(self, cfg: Qwen3NextConfig, w: Weights) -> None:
        super().__init__()
        self.top_k, self.norm_topk = cfg.top_k, cfg.norm_topk_prob
        self.router = w.linear("gate")
        self.experts = nn.ModuleList(
            GatedMLP(w.sub(f"experts.{e}.")) for e in range(cfg.num_experts)
        )
        self.shared = GatedMLP(w.sub("shared_expert."))
        self.shared_gate = w.linear("shared_expert_gate")

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.router(h), dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk:
            weights = weights / weights.sum(-1, keepdim=True)
        weights = weights.to(h.dtype)
        out = torch.zeros_like(h)
        for e in chosen.unique().tolist():  # ascending expert order, as the reference sums
            rows, slot = torch.where(chosen == e)
            y = self.experts[e](h[rows]) * weights[rows, slot, None]
            out.index_add_(0, rows, y)
        return out + lanewise(torch.sigmoid, self.shared_gate(h)) * self.shared(h)


class Qwen3NextLayer(Qwen35Layer):
    def make_mlp(self, cfg: Qwen35Config, index: int, w: Weights) -> nn.Module:
        assert isinstance(cfg, Qwen3NextConfig)
        return SparseMoE(cfg, w) if cfg.is_sparse(index) else GatedMLP(w)


class Qwen3NextLM(Qwen35LM):
    layer_cls = Qwen3NextLayer

    def __init__(self, cfg: Qwen3NextConfig, get: Any, device: str = "cpu", attention: Any = None):
        super().__init__(cfg, regrouped(get, cfg), device, attention)

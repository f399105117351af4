"""Shared pieces of the hybrid decoders (Gemma 3, Qwen3.5, LFM2, Qwen3-Next): layer kinds, the
common config, and the model skeleton (embed → layers → norm → head).

Layer kinds: "full" (attention over the FULL pool), "swa" (sliding-window attention over the SWA
pool), "state" (recurrent / convolution layers over the StatePool). The i-th layer of a kind uses
layer `kind_index[i]` of that kind's pool; attention layers go through
`radixkv.model.attention.KVStep` and the model's attention backend. The contract with the engine
is ForwardBatch (see its docstring) plus `radixkv.memory.hybrid.ModelPools`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixkv.memory.hybrid import ModelPools, PoolSpec, StateLayerSpec
from radixkv.memory.pool import KVPoolConfig
from radixkv.model.attention import (
    AttentionBackend,
    AttnLayer,
    KVStep,
    TorchAttention,
    kv_components,
)
from radixkv.model.batch import ForwardBatch
from radixkv.model.config import UnsupportedArchitectureError, _opt_int, base_fields
from radixkv.model.nn.blocks import Weights
from radixkv.model.nn.linear import PackedLinear

KINDS = ("full", "swa", "state")
# HF `layer_types` entries → our component kinds.
_HF_KINDS = {
    "full_attention": "full",
    "attention": "full",
    "sliding_attention": "swa",
    "linear_attention": "state",
    "conv": "state",
    "mamba": "state",
}


def layer_kinds(raw: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    """Per-layer kinds from HF `layer_types`; without it, a `sliding_window` means all-sliding."""
    types = raw.get("layer_types")
    if types is None:
        kind = "swa" if raw.get("sliding_window") else "full"
        return (kind,) * num_layers
    if len(types) != num_layers:
        raise UnsupportedArchitectureError(
            f"layer_types has {len(types)} entries, not {num_layers}"
        )
    unknown = sorted({t for t in types if t not in _HF_KINDS})
    if unknown:
        raise UnsupportedArchitectureError(f"unsupported layer types {unknown}")
    return tuple(_HF_KINDS[t] for t in types)


def kind_indices(kinds: Sequence[str]) -> tuple[int, ...]:
    """For each layer, its index among the layers of the same kind (= its pool layer)."""
    seen = dict.fromkeys(KINDS, 0)
    out = []
    for k in kinds:
        out.append(seen[k])
        seen[k] += 1
    return tuple(out)


@dataclass(frozen=True)
class HybridConfig:
    """What the engine reads from any model config, plus the layer kinds. Families subclass it
    (frozen dataclasses) and implement `state_layer_specs`."""

    architecture: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    max_position_embeddings: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    layer_kinds: tuple[str, ...]
    sliding_window: int | None
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    torch_dtype: str | None

    @staticmethod
    def common(raw: dict[str, Any], gen: dict[str, Any] | None, **over: Any) -> dict[str, Any]:
        """The base fields parsed from an HF config dict (`over` replaces any of them)."""
        fields = base_fields(raw, gen)
        fields["architecture"] = (raw.get("architectures") or ["?"])[0]
        fields["layer_kinds"] = layer_kinds(raw, fields["num_layers"])
        fields["sliding_window"] = _opt_int(raw.get("sliding_window"))
        fields.update(over)
        if "swa" in fields["layer_kinds"] and not fields["sliding_window"]:
            raise UnsupportedArchitectureError("sliding layers without a sliding_window")
        return fields

    def state_layer_specs(self) -> tuple[StateLayerSpec, ...]:
        """Per-slot state tensors of each state layer (families with state layers override)."""
        if "state" in self.layer_kinds:
            raise NotImplementedError(f"{type(self).__name__} has state layers but no state spec")
        return ()

    def count(self, kind: str) -> int:
        return sum(1 for k in self.layer_kinds if k == kind)

    def pool_spec(self) -> PoolSpec:
        """The components (and shapes) this model reads and writes."""
        has_swa = self.count("swa") > 0
        return PoolSpec(
            num_full_layers=self.count("full"),
            num_swa_layers=self.count("swa"),
            swa_window=self.sliding_window if has_swa else None,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            state_layers=self.state_layer_specs(),
        )

    def pool_config(
        self, num_slots: int, dtype: torch.dtype = torch.float32, device: str = "cpu"
    ) -> KVPoolConfig:
        """The FULL component's KV pool (legacy single-pool callers); see `pool_spec` for all."""
        return KVPoolConfig(
            self.count("full"), self.num_kv_heads, self.head_dim, num_slots, dtype, device
        )


@dataclass
class Step:
    """Everything a layer needs in one forward (built once by HybridLM.forward)."""

    batch: ForwardBatch
    positions: torch.Tensor
    kv: KVStep
    pools: ModelPools
    cache: dict[str, Any]  # per-forward derived tensors (e.g. cos/sin per rope kind, state meta)


class HybridLM(nn.Module):
    """Embed → layers → final norm → head. Families set `layers`, `embed_scale`,
    `final_softcap`, `attn_scale`, implement `final_norm` and build their per-forward extras in
    `prepare`. The head is a PackedLinear (the row-invariant GEMM where it serves)."""

    def __init__(
        self, cfg: HybridConfig, w: Weights, device: str, attention: AttentionBackend | None
    ) -> None:
        super().__init__()
        self.config = cfg
        self.spec = cfg.pool_spec()
        self.attention: AttentionBackend = attention or TorchAttention()
        self.embed = w.need("model.embed_tokens.weight")
        head = None if cfg.tie_word_embeddings else w.maybe("lm_head.weight")
        self.lm_head = self.embed if head is None else head
        self.head = PackedLinear(self.lm_head.detach())
        self.attn_scale = cfg.head_dim**-0.5
        self._attn_layers: dict[int, AttnLayer] | None = None
        self.embed_scale: float | None = None
        self.final_softcap: float | None = None
        self.layers = nn.ModuleList()
        self.norm: nn.Parameter | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def attn_layers(self) -> dict[int, AttnLayer]:
        """Each attention layer's component, pool layer, window and scale."""
        cfg = self.config
        out = {}
        for i, (kind, j) in enumerate(
            zip(cfg.layer_kinds, kind_indices(cfg.layer_kinds), strict=True)
        ):
            if kind != "state":
                window = cfg.sliding_window if kind == "swa" else None
                out[i] = AttnLayer(kind, j, window, self.attn_scale)
        return out

    def prepare(self, step: Step) -> None:
        """Family hook: fill `step.cache` (rope tables, state metadata) before the layers run."""

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, pools: ModelPools) -> torch.Tensor:
        if not isinstance(pools, ModelPools):
            raise TypeError(f"{self.config.architecture} needs ModelPools (memory.hybrid)")
        batch = batch.to(self.device)
        x = F.embedding(batch.input_ids, self.embed)
        if self.embed_scale is not None:
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        if self._attn_layers is None:  # families set attn_scale after this class's __init__
            self._attn_layers = self.attn_layers()
        components = kv_components(batch, pools, self.spec)
        kv = KVStep(self.attention, components, self._attn_layers, batch.attention)
        step = Step(batch, batch.positions, kv, pools, {})
        self.prepare(step)
        for layer in self.layers:
            x = layer(x, step)
        if not batch.return_all_logits:
            x = x.index_select(0, batch.q_start[1:] - 1)
        logits = self.head(self.final_norm(x)).float()
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits

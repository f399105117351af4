"""Shared pieces of the hybrid decoders (Gemma 3, Qwen3.5, LFM2): layer kinds, the common config,
per-component K/V attention, and the model skeleton (embed → layers → norm → head).

Layer kinds: "full" (attention over the FULL pool), "swa" (sliding-window attention over the SWA
pool), "state" (recurrent / convolution layers over the StatePool). The i-th layer of a kind uses
layer `kind_index[i]` of that kind's pool. The contract with the engine is ForwardBatch (see its
docstring) plus `radixkv.memory.hybrid.ModelPools`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixkv.engine.batch import ForwardBatch
from radixkv.memory.hybrid import ModelPools, PoolSpec, StateLayerSpec
from radixkv.memory.pool import KVPool, KVPoolConfig
from radixkv.model.attention import AttentionBackend, AttentionMetadata, TorchAttention
from radixkv.model.config import UnsupportedArchitectureError, _eos_ids, _opt_int

WeightGetter = Callable[[str], "torch.Tensor | None"]
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
        num_layers = int(raw["num_hidden_layers"])
        num_heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        g = gen or {}
        fields: dict[str, Any] = dict(
            architecture=(raw.get("architectures") or ["?"])[0],
            num_layers=num_layers,
            hidden_size=hidden,
            vocab_size=int(raw["vocab_size"]),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            num_heads=num_heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=int(raw.get("head_dim") or hidden // num_heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", raw.get("norm_eps", 1e-6))),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            layer_kinds=layer_kinds(raw, num_layers),
            sliding_window=_opt_int(raw.get("sliding_window")),
            eos_token_ids=_eos_ids(raw, g),
            bos_token_id=_opt_int(g.get("bos_token_id", raw.get("bos_token_id"))),
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
        )
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


def param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.contiguous(), requires_grad=False)


class Weights:
    """`need(name)` / `maybe(name)` under a prefix, over the loader's getter."""

    def __init__(self, get: WeightGetter, prefix: str = "") -> None:
        self.get, self.prefix = get, prefix

    def need(self, name: str) -> nn.Parameter:
        t = self.get(self.prefix + name)
        if t is None:
            raise KeyError(f"checkpoint is missing {self.prefix + name}")
        return param(t)

    def maybe(self, name: str) -> nn.Parameter | None:
        t = self.get(self.prefix + name)
        return None if t is None else param(t)

    def sub(self, prefix: str) -> Weights:
        return Weights(self.get, self.prefix + prefix)


def rms_norm_1p(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma-style RMSNorm: float32 statistics, scaled by (1 + weight) in float32, cast back."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (1.0 + weight.float())).to(x.dtype)


def swa_view(batch: ForwardBatch) -> ForwardBatch:
    """The batch as the SWA pool sees it: SWA slots in place of FULL ones. Freed positions (-1)
    become slot 0: they are outside every window of this step, so never attended, and a backend
    that gathers them anyway reads finite data it masks out."""
    if batch.swa_context_slots is None or batch.swa_out_slots is None:
        raise ValueError("this model has sliding-window layers: the batch needs swa_context_slots")
    return dataclasses.replace(
        batch,
        context_slots=tuple(c.clamp(min=0) for c in batch.swa_context_slots),
        out_slots=batch.swa_out_slots,
    )


class KVComponents:
    """Per-forward access to the FULL and SWA pools: write a layer's new K/V, attend by slot."""

    def __init__(
        self,
        batch: ForwardBatch,
        pools: ModelPools,
        spec: PoolSpec,
        attention: AttentionBackend,
        device: torch.device,
    ) -> None:
        self.attention = attention
        self.pools: dict[str, KVPool] = {}
        self.meta: dict[str, AttentionMetadata] = {}
        self.out: dict[str, torch.Tensor] = {}
        if spec.has_full:
            if pools.full is None:
                raise ValueError("this model has full-attention layers: pools.full is required")
            self.pools["full"] = pools.full
            self.meta["full"] = attention.prepare(batch, device)
            self.out["full"] = batch.out_slots.to(device)
        if spec.has_swa:
            if pools.swa is None:
                raise ValueError("this model has sliding-window layers: pools.swa is required")
            view = swa_view(batch)
            self.pools["swa"] = pools.swa
            self.meta["swa"] = attention.prepare(view, device)
            self.out["swa"] = view.out_slots.to(device)

    def attend(
        self,
        kind: str,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        window: int | None,
        scale: float,
    ) -> torch.Tensor:
        """Write k/v ([T, KV, D]) to pool layer `layer` of component `kind`, then attend q."""
        pool = self.pools[kind]
        # Invariant: new K/V are in the pool before attention reads the context by slot.
        pool.write(layer, self.out[kind], k, v)
        return self.attention.attend(
            q, pool.k[layer], pool.v[layer], self.meta[kind], window, scale
        )


@dataclass
class Step:
    """Everything a layer needs in one forward (built once by HybridLM.forward)."""

    batch: ForwardBatch
    positions: torch.Tensor
    kv: KVComponents
    pools: ModelPools
    cache: dict[str, Any]  # per-forward derived tensors (e.g. cos/sin per rope kind, state meta)


class HybridLM(nn.Module):
    """Embed → layers → final norm → head. Families set `layers`, `norm_fn`, `embed_scale`,
    `final_softcap` and build their per-forward extras in `prepare`."""

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

    def prepare(self, step: Step) -> None:
        """Family hook: fill `step.cache` (rope tables, state metadata) before the layers run."""

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, pools: ModelPools) -> torch.Tensor:
        if not isinstance(pools, ModelPools):
            raise TypeError(f"{self.config.architecture} needs ModelPools (memory.hybrid)")
        device = self.device
        x = F.embedding(batch.input_ids.to(device), self.embed)
        if self.embed_scale is not None:
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        kv = KVComponents(batch, pools, self.spec, self.attention, device)
        step = Step(batch, batch.positions.to(device), kv, pools, {})
        self.prepare(step)
        for layer in self.layers:
            x = layer(x, step)
        if not batch.return_all_logits:
            last = torch.tensor(batch.extend_lens, device=device).cumsum(0) - 1
            x = x.index_select(0, last)
        logits = F.linear(self.final_norm(x), self.lm_head).float()
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits


def single_pool(
    batch: ForwardBatch, pools: KVPool | ModelPools, spec: PoolSpec
) -> tuple[ForwardBatch, KVPool]:
    """For a one-component Llama-family model: the (batch, pool) its layers run on. A bare KVPool
    is the legacy call (as is); ModelPools picks the FULL pool, or, for an all-sliding model
    (Mistral), the SWA pool with the batch's SWA slots."""
    if isinstance(pools, KVPool):
        return batch, pools
    if spec.has_swa:
        if pools.swa is None:
            raise ValueError("this model's layers are all sliding-window: pools.swa is required")
        return swa_view(batch), pools.swa
    if pools.full is None:
        raise ValueError("pools.full is required")
    return batch, pools.full

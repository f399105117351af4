"""The Llama-family decoder (Llama/SmolLM2, Qwen2, Qwen3, Mistral) over the slot-indexed KV pool.

Family differences are config flags: Q/K/V bias (Qwen2), per-head Q/K RMSNorm before RoPE (Qwen3),
per-layer sliding windows (Mistral), tied embeddings. Q/K/V and gate/up projections are fused into
one matmul each at load time; names of the fused parameters are ours, the loader maps HF names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import nn

from radixkv.memory.hybrid import ModelPools
from radixkv.memory.pool import KVPool
from radixkv.model.attention import (
    AttentionBackend,
    AttnLayer,
    KVStep,
    TorchAttention,
    kv_components,
)
from radixkv.model.batch import ForwardBatch
from radixkv.model.config import LlamaConfig
from radixkv.model.nn.blocks import (
    Attention,
    AttentionSpec,
    GatedMLP,
    LayerOps,
    WeightGetter,
    Weights,
)
from radixkv.model.nn.layers import rms_norm, rope_cos_sin, rope_inv_freq
from radixkv.model.nn.linear import PackedLinear
from radixkv.model.nn.native_stack import NativeStack

if TYPE_CHECKING:
    from radixkv.model.nn.compiled import CompiledStack

__all__ = ["CausalLM", "DecoderLayer", "LayerOps", "WeightGetter"]


class DecoderLayer(nn.Module):
    """One pre-norm block: attention with the KV pool, then a SwiGLU MLP."""

    def __init__(self, cfg: LlamaConfig, index: int, w: Weights) -> None:
        super().__init__()
        self.index = index
        self.window = cfg.layer_windows[index]
        self.eps = cfg.rms_norm_eps
        self.input_norm = w.need("input_layernorm.weight")
        self.post_norm = w.need("post_attention_layernorm.weight")
        spec = AttentionSpec(
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.rms_norm_eps,
            qkv_bias=cfg.qkv_bias,
            o_bias=cfg.o_bias,
            qk_norm="rms" if cfg.qk_norm else None,
        )
        self.attn = Attention(spec, index, w.sub("self_attn."))
        self.mlp = GatedMLP(w.sub("mlp."), bias=cfg.mlp_bias)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ops: LayerOps
    ) -> torch.Tensor:
        """x [T, hidden] → x after this block. `ops` supplies the linear and attention calls
        (eager, or custom ops when traced by the compiler); everything else is a custom op or
        element-wise torch (residual adds, casts)."""
        x = x + self.attn(rms_norm(x, self.input_norm, self.eps), cos, sin, ops)
        return x + self.mlp(rms_norm(x, self.post_norm, self.eps), ops)


class CausalLM(nn.Module):
    """`model(batch, pool)` → float32 logits: [R, vocab] (each request's last new token) or
    [T, vocab] when `batch.return_all_logits`."""

    def __init__(
        self,
        cfg: LlamaConfig,
        get: WeightGetter,
        device: str = "cpu",
        attention: AttentionBackend | None = None,
    ) -> None:
        super().__init__()
        self.config = cfg
        self.pool_spec = cfg.pool_spec()
        self.attention: AttentionBackend = attention or TorchAttention()
        w = Weights(get)
        self.embed = w.need("model.embed_tokens.weight")
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, i, w.sub(f"model.layers.{i}.")) for i in range(cfg.num_layers)
        )
        self.norm = w.need("model.norm.weight")
        head = None if cfg.tie_word_embeddings else w.maybe("lm_head.weight")
        # Tied checkpoints (or ones that omit lm_head) share the embedding matrix.
        self.lm_head = self.embed if head is None else head
        # The output projection in packed form (a packed copy when tied: the embedding lookup
        # needs the plain matrix).
        self.head = PackedLinear(self.lm_head.detach())
        self.windows = [layer.window for layer in self.decoder_layers]
        # One KV component: FULL, or SWA for an all-sliding model (Mistral).
        kind = "full" if self.pool_spec.has_full or not self.pool_spec.has_swa else "swa"
        scale = cfg.head_dim**-0.5
        self.attn_layers = {i: AttnLayer(kind, i, w, scale) for i, w in enumerate(self.windows)}
        self.compiled: CompiledStack | None = None
        self._native: NativeStack | bool | None = True  # True: not built yet
        self.inv_freq: torch.Tensor
        self.register_buffer(
            "inv_freq",
            rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling_dict).to(device),
            persistent=False,
        )

    @property
    def decoder_layers(self) -> list[DecoderLayer]:
        return [cast(DecoderLayer, layer) for layer in self.layers]

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    supports_compile = True  # ModelRunner.compile: this model has a compiled layer stack

    def compile(self) -> None:
        """Run the layer stack through torch.compile from now on (see radixkv.model.nn.compiled).
        Idempotent: a model shared by several engines is compiled once."""
        from radixkv.model.nn.compiled import CompiledStack

        if self.compiled is None:
            self.compiled = CompiledStack(self.decoder_layers)

    def native_stack(self) -> NativeStack | None:
        """The layers as one C++ call (radixkv.model.nn.native_stack), built on first use; None
        where it cannot serve this model."""
        if self._native is True:
            self._native = NativeStack.of(self)
        return self._native if isinstance(self._native, NativeStack) else None

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, pool: KVPool | ModelPools) -> torch.Tensor:
        batch = batch.to(self.device)
        x = F.embedding(batch.input_ids, self.embed)
        cos, sin = rope_cos_sin(batch.positions, self.inv_freq, x.dtype)
        components = kv_components(batch, pool, self.pool_spec)  # ModelPools → its one pool
        ctx = KVStep(self.attention, components, self.attn_layers, batch.attention)
        native = self.native_stack()
        if self.compiled is not None:
            x = self.compiled(x, cos, sin, ctx)
        elif native is not None and native.serves(x, cos, ctx):
            x = native(x, cos, sin, ctx)
        else:
            for layer in self.layers:
                x = layer(x, cos, sin, ctx)
        if not batch.return_all_logits:
            x = x.index_select(0, batch.q_start[1:] - 1)
        x = rms_norm(x, self.norm, self.config.rms_norm_eps)
        return self.head(x).float()

"""The Llama-family decoder (Llama/SmolLM2, Qwen2, Qwen3, Mistral) over the slot-indexed KV pool.

Family differences are config flags: Q/K/V bias (Qwen2), per-head Q/K RMSNorm before RoPE (Qwen3),
per-layer sliding windows (Mistral), tied embeddings. Q/K/V and gate/up projections are fused into
one matmul each at load time; names of the fused parameters are ours, the loader maps HF names.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from radixkv.engine.batch import ForwardBatch
from radixkv.memory.hybrid import ModelPools
from radixkv.memory.pool import KVPool
from radixkv.model.attention import AttentionBackend, AttentionMetadata, TorchAttention
from radixkv.model.config import ModelConfig
from radixkv.model.hybrid import single_pool
from radixkv.model.layers import apply_rope, rms_norm, rope_cos_sin, rope_inv_freq

# Returns the HF tensor of that name (already on the target device/dtype), or None if absent.
WeightGetter = Callable[[str], "torch.Tensor | None"]


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.contiguous(), requires_grad=False)


class DecoderLayer(nn.Module):
    """One pre-norm block: attention with the KV pool, then a SwiGLU MLP."""

    def __init__(self, cfg: ModelConfig, index: int, get: WeightGetter) -> None:
        super().__init__()
        self.index = index
        self.window = cfg.layer_windows[index]
        self.eps = cfg.rms_norm_eps
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        p = f"model.layers.{index}."

        def need(name: str) -> torch.Tensor:
            t = get(p + name)
            if t is None:
                raise KeyError(f"checkpoint is missing {p + name}")
            return t

        def maybe(name: str, wanted: bool) -> torch.Tensor | None:
            return need(name) if wanted else None

        a = "self_attn."
        self.input_norm = _param(need("input_layernorm.weight"))
        self.post_norm = _param(need("post_attention_layernorm.weight"))
        self.qkv_w = _param(
            torch.cat(
                [need(a + "q_proj.weight"), need(a + "k_proj.weight"), need(a + "v_proj.weight")]
            )
        )
        self.qkv_b = (
            _param(torch.cat([need(a + f"{n}_proj.bias") for n in "qkv"])) if cfg.qkv_bias else None
        )
        self.o_w = _param(need(a + "o_proj.weight"))
        o_b = maybe(a + "o_proj.bias", cfg.o_bias)
        self.o_b = None if o_b is None else _param(o_b)
        self.q_norm = _param(need(a + "q_norm.weight")) if cfg.qk_norm else None
        self.k_norm = _param(need(a + "k_norm.weight")) if cfg.qk_norm else None
        m = "mlp."
        self.inter = cfg.intermediate_size
        self.gate_up_w = _param(
            torch.cat([need(m + "gate_proj.weight"), need(m + "up_proj.weight")])
        )
        self.gate_up_b = (
            _param(torch.cat([need(m + "gate_proj.bias"), need(m + "up_proj.bias")]))
            if cfg.mlp_bias
            else None
        )
        self.down_w = _param(need(m + "down_proj.weight"))
        down_b = maybe(m + "down_proj.bias", cfg.mlp_bias)
        self.down_b = None if down_b is None else _param(down_b)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        out_slots: torch.Tensor,
        pool: KVPool,
        attn: AttentionBackend,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        t = x.shape[0]
        h = rms_norm(x, self.input_norm, self.eps)
        qkv = F.linear(h, self.qkv_w, self.qkv_b)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(t, self.num_heads, self.head_dim)
        k = k.reshape(t, self.num_kv_heads, self.head_dim)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = rms_norm(q, self.q_norm, self.eps)
            k = rms_norm(k, self.k_norm, self.eps)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        # Invariant: new K/V are in the pool before attention reads the context by slot.
        pool.write(self.index, out_slots, k, v)
        o = attn.attend(
            q, pool.k[self.index], pool.v[self.index], meta, self.window, self.head_dim**-0.5
        )
        x = x + F.linear(o.reshape(t, self.q_size).to(x.dtype), self.o_w, self.o_b)
        h = rms_norm(x, self.post_norm, self.eps)
        gate, up = F.linear(h, self.gate_up_w, self.gate_up_b).split(self.inter, dim=-1)
        return x + F.linear(F.silu(gate) * up, self.down_w, self.down_b)


class CausalLM(nn.Module):
    """`model(batch, pool)` → float32 logits: [R, vocab] (each request's last new token) or
    [T, vocab] when `batch.return_all_logits`."""

    def __init__(
        self,
        cfg: ModelConfig,
        get: WeightGetter,
        device: str = "cpu",
        attention: AttentionBackend | None = None,
    ) -> None:
        super().__init__()
        self.config = cfg
        self.pool_spec = cfg.pool_spec()
        self.attention: AttentionBackend = attention or TorchAttention()
        embed = get("model.embed_tokens.weight")
        if embed is None:
            raise KeyError("checkpoint is missing model.embed_tokens.weight")
        self.embed = _param(embed)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, get) for i in range(cfg.num_layers))
        norm = get("model.norm.weight")
        if norm is None:
            raise KeyError("checkpoint is missing model.norm.weight")
        self.norm = _param(norm)
        head = None if cfg.tie_word_embeddings else get("lm_head.weight")
        # Tied checkpoints (or ones that omit lm_head) share the embedding matrix.
        self.lm_head = self.embed if head is None else _param(head)
        self.inv_freq: torch.Tensor
        self.register_buffer(
            "inv_freq",
            rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling_dict).to(device),
            persistent=False,
        )

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, pool: KVPool | ModelPools) -> torch.Tensor:
        batch, pool = single_pool(batch, pool, self.pool_spec)  # ModelPools → its one pool
        device = self.device
        ids = batch.input_ids.to(device)
        positions = batch.positions.to(device)
        out_slots = batch.out_slots.to(device)
        x = F.embedding(ids, self.embed)
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)
        meta = self.attention.prepare(batch, device)
        for layer in self.layers:
            x = layer(x, cos, sin, out_slots, pool, self.attention, meta)
        if not batch.return_all_logits:
            last = torch.tensor(batch.extend_lens, device=device).cumsum(0) - 1
            x = x.index_select(0, last)
        x = rms_norm(x, self.norm, self.config.rms_norm_eps)
        return F.linear(x, self.lm_head).float()

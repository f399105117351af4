"""The Llama-family decoder (Llama/SmolLM2, Qwen2, Qwen3, Mistral) over the slot-indexed KV pool.

Family differences are config flags: Q/K/V bias (Qwen2), per-head Q/K RMSNorm before RoPE (Qwen3),
per-layer sliding windows (Mistral), tied embeddings. Q/K/V and gate/up projections are fused into
one matmul each at load time; names of the fused parameters are ours, the loader maps HF names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from radixkv.engine.batch import ForwardBatch
from radixkv.memory.hybrid import ModelPools
from radixkv.memory.pool import KVPool
from radixkv.model.attention import AttentionBackend, AttentionMetadata, TorchAttention
from radixkv.model.config import ModelConfig
from radixkv.model.hybrid import single_pool
from radixkv.model.layers import apply_rope, rms_norm, rope_cos_sin, rope_inv_freq, silu_mul
from radixkv.model.linear import PackedLinear

if TYPE_CHECKING:
    from radixkv.model.compiled import CompiledStack

# Returns the HF tensor of that name (already on the target device/dtype), or None if absent.
WeightGetter = Callable[[str], "torch.Tensor | None"]


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.contiguous(), requires_grad=False)


class LayerOps(Protocol):
    """The two calls a decoder layer makes that are not element-wise: a projection and
    attention over the pool (which also stores this step's K/V)."""

    def linear(self, lin: PackedLinear, x: torch.Tensor) -> torch.Tensor: ...

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor: ...


@dataclass
class ForwardContext:
    """What attention needs during one forward: the pool, the backend and its per-forward
    metadata, where this step's tokens' K/V go, and each layer's window and scale."""

    pool: KVPool
    backend: AttentionBackend
    meta: AttentionMetadata
    out_slots: torch.Tensor
    windows: list[int | None]
    scale: float

    def linear(self, lin: PackedLinear, x: torch.Tensor) -> torch.Tensor:
        return lin(x)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # Invariant: new K/V are in the pool before attention reads the context by slot.
        self.pool.write(layer, self.out_slots, k, v)
        return self.backend.attend(
            q, self.pool.k[layer], self.pool.v[layer], self.meta, self.windows[layer], self.scale
        )


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
        self.qkv = PackedLinear(
            torch.cat(
                [need(a + "q_proj.weight"), need(a + "k_proj.weight"), need(a + "v_proj.weight")]
            ),
            torch.cat([need(a + f"{n}_proj.bias") for n in "qkv"]) if cfg.qkv_bias else None,
        )
        self.o_proj = PackedLinear(need(a + "o_proj.weight"), maybe(a + "o_proj.bias", cfg.o_bias))
        self.q_norm = _param(need(a + "q_norm.weight")) if cfg.qk_norm else None
        self.k_norm = _param(need(a + "k_norm.weight")) if cfg.qk_norm else None
        m = "mlp."
        self.inter = cfg.intermediate_size
        self.gate_up = PackedLinear(
            torch.cat([need(m + "gate_proj.weight"), need(m + "up_proj.weight")]),
            torch.cat([need(m + "gate_proj.bias"), need(m + "up_proj.bias")])
            if cfg.mlp_bias
            else None,
        )
        self.down = PackedLinear(
            need(m + "down_proj.weight"), maybe(m + "down_proj.bias", cfg.mlp_bias)
        )

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ops: LayerOps
    ) -> torch.Tensor:
        """x [T, hidden] → x after this block. `ops` supplies the linear and attention calls
        (eager, or custom ops when traced by the compiler); everything else here is plain
        element-wise torch that inductor fuses (residual add + RMSNorm, RoPE, SiLU * up)."""
        t = x.shape[0]
        h = rms_norm(x, self.input_norm, self.eps)
        qkv = ops.linear(self.qkv, h)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(t, self.num_heads, self.head_dim)
        k = k.reshape(t, self.num_kv_heads, self.head_dim)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = rms_norm(q, self.q_norm, self.eps)
            k = rms_norm(k, self.k_norm, self.eps)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        o = ops.attend(self.index, q, k, v)
        x = x + ops.linear(self.o_proj, o.reshape(t, self.q_size).to(x.dtype))
        h = rms_norm(x, self.post_norm, self.eps)
        return x + ops.linear(self.down, silu_mul(ops.linear(self.gate_up, h)))


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
        # The output projection in packed form (a packed copy when tied: the embedding lookup
        # needs the plain matrix).
        self.head = PackedLinear(self.lm_head.detach())
        self.windows = [layer.window for layer in self.decoder_layers]
        self.compiled: CompiledStack | None = None
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
        """Run the layer stack through torch.compile from now on (see radixkv.model.compiled).
        Idempotent: a model shared by several engines is compiled once."""
        from radixkv.model.compiled import CompiledStack

        if self.compiled is None:
            self.compiled = CompiledStack(self.decoder_layers)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, pool: KVPool | ModelPools) -> torch.Tensor:
        batch, pool = single_pool(batch, pool, self.pool_spec)  # ModelPools → its one pool
        device = self.device
        ids = batch.input_ids.to(device)
        positions = batch.positions.to(device)
        x = F.embedding(ids, self.embed)
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)
        ctx = ForwardContext(
            pool=pool,
            backend=self.attention,
            meta=self.attention.prepare(batch, device),
            out_slots=batch.out_slots.to(device),
            windows=self.windows,
            scale=self.config.head_dim**-0.5,
        )
        if self.compiled is not None:
            x = self.compiled(x, cos, sin, ctx)
        else:
            for layer in self.layers:
                x = layer(x, cos, sin, ctx)
        if not batch.return_all_logits:
            last = torch.tensor(batch.extend_lens, device=device).cumsum(0) - 1
            x = x.index_select(0, last)
        x = rms_norm(x, self.norm, self.config.rms_norm_eps)
        return self.head(x).float()

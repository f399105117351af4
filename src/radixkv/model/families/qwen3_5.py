"""Qwen3.5 text (`Qwen3_5ForCausalLM`): gated DeltaNet layers beside gated full attention.

DeltaNet layer: in_proj_qkv → depthwise causal conv (kernel K, SiLU; state = the last K-1 inputs)
→ q, k, v; beta = sigmoid(in_proj_b), g = -exp(A_log) * softplus(in_proj_a + dt_bias); the gated
delta rule (radixkv.model.families.deltanet: the C++ kernel, token by token in one order for
prompts, chunks and decode steps alike) over a float32 state [v_heads, dk, dv]; per-head RMSNorm
gated by SiLU(in_proj_z); out_proj.
Attention layer: q_proj yields queries and an output gate per head; (1 + w) Q/K norms; RoPE on the
first `partial_rotary_factor` of each head; output * sigmoid(gate). Norms are (1 + w) RMSNorms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixkv.memory.state_pool import StateLayerSpec, StateTensorSpec
from radixkv.model.attention import AttentionBackend
from radixkv.model.config import (
    ModelConfig,
    UnsupportedArchitectureError,
    _parse_rope,
    kind_indices,
)
from radixkv.model.families import deltanet
from radixkv.model.families.skeleton import Forward
from radixkv.model.families.state_layers import (
    RopeState,
    RopeStateLM,
    StateMeta,
    causal_conv,
    read_state,
)
from radixkv.model.nn.blocks import Attention, AttentionSpec, GatedMLP, WeightGetter, Weights
from radixkv.model.nn.layers import lanewise, rms_norm, rms_norm_1p

ARCH = "Qwen3_5ForCausalLM"


@dataclass(frozen=True)
class Qwen35Config(ModelConfig):
    rope_theta: float = 10_000.0
    rotary_dim: int = 0
    conv_kernel: int = 4
    k_heads: int = 16
    v_heads: int = 32
    k_dim: int = 128
    v_dim: int = 128

    @classmethod
    def from_dict(cls, raw: dict[str, Any], gen: dict[str, Any] | None = None) -> Qwen35Config:
        return cls(**cls.parse(raw, gen, ARCH))

    @classmethod
    def parse(cls, raw: dict[str, Any], gen: dict[str, Any] | None, arch: str) -> dict[str, Any]:
        """The fields shared with Qwen3-Next, as constructor keyword arguments."""
        raw = dict(raw.get("text_config") or raw) | {"architectures": [arch]}
        n = int(raw["num_hidden_layers"])
        if raw.get("layer_types") is None:
            every = int(raw.get("full_attention_interval", 4))
            raw["layer_types"] = [
                "full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)
            ]
        if raw.get("hidden_act", "silu") != "silu" or raw.get("attention_bias"):
            raise UnsupportedArchitectureError(f"{arch}: only silu, no attention bias")
        params = dict(raw.get("rope_parameters") or {})
        partial = float(params.pop("partial_rotary_factor", raw.get("partial_rotary_factor", 0.25)))
        for k in ("mrope_section", "mrope_interleaved"):  # text-only: all sections share positions
            params.pop(k, None)
        theta, scaling = _parse_rope({"rope_parameters": params, **_theta(raw)}, arch)
        if scaling is not None:
            raise UnsupportedArchitectureError(f"{arch}: rope scaling is not supported")
        common = cls.common(raw, gen, sliding_window=None)
        return dict(
            **common,
            rope_theta=theta,
            rotary_dim=int(common["head_dim"] * partial),
            conv_kernel=int(raw.get("linear_conv_kernel_dim", 4)),
            k_heads=int(raw.get("linear_num_key_heads", 16)),
            v_heads=int(raw.get("linear_num_value_heads", 32)),
            k_dim=int(raw.get("linear_key_head_dim", 128)),
            v_dim=int(raw.get("linear_value_head_dim", 128)),
        )

    @property
    def conv_dim(self) -> int:
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim

    def state_layer_specs(self) -> tuple[StateLayerSpec, ...]:
        conv = StateTensorSpec("conv", (self.conv_dim, self.conv_kernel - 1))
        rec = StateTensorSpec("recurrent", (self.v_heads, self.k_dim, self.v_dim), torch.float32)
        return tuple(StateLayerSpec((conv, rec)) for _ in range(self.count("state")))


def _theta(raw: dict[str, Any]) -> dict[str, Any]:
    return {"rope_theta": raw["rope_theta"]} if raw.get("rope_theta") else {}


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: Qwen35Config, w: Weights) -> None:
        super().__init__()
        self.cfg = cfg
        self.in_qkv, self.in_z = w.linear("in_proj_qkv"), w.linear("in_proj_z")
        self.in_ba = w.linear("in_proj_b", "in_proj_a")
        self.conv_w = nn.Parameter(w.need("conv1d.weight")[:, 0, :].contiguous(), False)
        self.conv_b = w.maybe("conv1d.bias")
        self.dt_bias, self.a_log = w.need("dt_bias"), w.need("A_log")
        self.norm_w, self.out_proj = w.need("norm.weight"), w.linear("out_proj")
        self.eps = cfg.rms_norm_eps

    def forward(
        self, h: torch.Tensor, state: dict[str, torch.Tensor], meta: StateMeta
    ) -> torch.Tensor:
        c = self.cfg
        t = h.shape[0]
        mixed = F.silu(causal_conv(self.in_qkv(h), state["conv"], meta, self.conv_w, self.conv_b))
        kd = c.k_heads * c.k_dim
        q, k, v = mixed.split([kd, kd, c.v_heads * c.v_dim], dim=-1)
        q, k = q.reshape(t, c.k_heads, c.k_dim), k.reshape(t, c.k_heads, c.k_dim)
        v = v.reshape(t, c.v_heads, c.v_dim)
        b, a = self.in_ba(h).split(c.v_heads, dim=-1)
        beta = lanewise(torch.sigmoid, b.float())
        g = -self.a_log.float().exp() * lanewise(F.softplus, a.float() + self.dt_bias.float())
        core = self._rule(q, k, v, g, beta, state["recurrent"], meta)
        z = self.in_z(h).reshape(t, c.v_heads, c.v_dim)
        o = rms_norm(core.to(h.dtype), self.norm_w, self.eps)  # norm before the gate
        o = (o * F.silu(z.float())).to(h.dtype)
        return self.out_proj(o.reshape(t, -1))

    def _rule(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        rec: torch.Tensor,
        meta: StateMeta,
    ) -> torch.Tensor:
        """q, k [T, Hk, dk] and v [T, Hv, dv] as the conv made them → o [T, Hv, dv] float32;
        states updated in place in the pool. The C++ kernel takes every run and decode row in
        one call, token by token in one fixed order; without it, the chunked form per
        prompt/chunk and the recurrent form for the batched decodes (which round differently)."""
        kern = deltanet.kernel(v)
        if kern is not None:
            starts, lens, slots, fresh = meta.kernel_runs()
            scale = self.cfg.k_dim**-0.5
            return kern.gated_delta_rule(q, k, v, g, beta, rec, starts, lens, slots, fresh, scale)
        q, k = deltanet.prepare_qk(q, k, self.cfg.v_heads)
        out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
        for run in meta.runs:
            r = slice(run.start, run.end)
            o, s = deltanet.chunked(q[r], k[r], v[r], g[r], beta[r], read_state(rec, run))
            out[r] = o
            rec[run.slot] = s
        if meta.decode_rows is not None and meta.decode_slots is not None:
            rows, slots = meta.decode_rows, meta.decode_slots
            o, s = deltanet.recurrent_step(
                q.index_select(0, rows),
                k.index_select(0, rows),
                v.index_select(0, rows),
                g.index_select(0, rows),
                beta.index_select(0, rows),
                rec.index_select(0, slots),
            )
            out.index_copy_(0, rows, o)
            rec.index_copy_(0, slots, s)
        return out


def attention_spec(cfg: Qwen35Config) -> AttentionSpec:
    """Gated attention: (1 + w) Q/K norms, partial RoPE, a sigmoid output gate per head."""
    return AttentionSpec(
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.rms_norm_eps,
        qk_norm="rms_1p",
        rotary_dim=cfg.rotary_dim,
        output_gate=True,
    )


class Qwen35Layer(nn.Module):
    def __init__(self, cfg: Qwen35Config, index: int, w: Weights) -> None:
        super().__init__()
        self.kind = cfg.layer_kinds[index]
        self.pool_layer = kind_indices(cfg.layer_kinds)[index]
        self.eps = cfg.rms_norm_eps
        self.in_norm = w.need("input_layernorm.weight")
        self.post_norm = w.need("post_attention_layernorm.weight")
        self.mixer: GatedDeltaNet | Attention
        if self.kind == "state":
            self.mixer = GatedDeltaNet(cfg, w.sub("linear_attn."))
        else:
            self.mixer = Attention(attention_spec(cfg), index, w.sub("self_attn."))
        self.mlp = self.make_mlp(cfg, index, w.sub("mlp."))

    def make_mlp(self, cfg: Qwen35Config, index: int, w: Weights) -> nn.Module:
        return GatedMLP(w)

    def forward(self, x: torch.Tensor, fwd: Forward[RopeState]) -> torch.Tensor:
        h = rms_norm_1p(x, self.in_norm, self.eps)
        if isinstance(self.mixer, GatedDeltaNet):
            pool = None if fwd.pools is None else fwd.pools.state()
            assert pool is not None
            state = pool.tensors[self.pool_layer]
            x = x + self.mixer(h, state, fwd.prep.meta())
        else:
            x = x + self.mixer(h, fwd.prep.cos, fwd.prep.sin, fwd.kv)
        return x + self.mlp(rms_norm_1p(x, self.post_norm, self.eps))


class Qwen35LM(RopeStateLM):
    layer_cls = Qwen35Layer
    final_norm_kind = "rms_1p"

    def __init__(
        self,
        cfg: Qwen35Config,
        get: WeightGetter,
        device: str = "cpu",
        attention: AttentionBackend | None = None,
    ) -> None:
        if "swa" in cfg.layer_kinds:
            raise UnsupportedArchitectureError(f"{cfg.architecture}: no sliding layers supported")
        super().__init__(cfg, get, device, attention)
        self.init_rope(cfg.rotary_dim, cfg.rope_theta, device)

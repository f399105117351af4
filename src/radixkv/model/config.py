"""The one config base every family's config extends (`ModelConfig`: what the engine and the
model skeleton read), the Llama family's configuration, and the parsing helpers every family's
config shares.

`ModelConfig` holds the fields parsed one way from any Hugging Face `config.json` (shapes, norm
epsilon, tied embeddings, EOS / BOS ids, per-layer kinds) and derives the pools the model needs
(`pool_spec`). A family's config is a frozen dataclass subclass with its own `from_dict`. The
Llama family (Llama/SmolLM2, Qwen2, Qwen3, Mistral) is one of them: its per-family differences are
plain flags (`qkv_bias`, `qk_norm`, per-layer sliding windows). Which class parses which
architecture is radixkv.model.registry's table.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from radixkv.memory.hybrid import (
    FULL,
    STATE,
    SWA,
    KVGroupSpec,
    LayerGroupSpec,
    PoolSpec,
    StateGroupSpec,
)
from radixkv.memory.pool import KVPoolConfig
from radixkv.memory.state_pool import StateLayerSpec
from radixkv.model.registry import LLAMA_ARCHITECTURES as LLAMA_ARCHITECTURES
from radixkv.model.registry import UnsupportedArchitectureError as UnsupportedArchitectureError
from radixkv.model.registry import architecture, family

SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", "llama3", "linear")
# Layer kinds: "full" (attention over the FULL pool), "swa" (sliding-window attention over the SWA
# pool), "state" (recurrent / convolution layers over the StatePool).
KINDS = ("full", "swa", "state")
# HF `layer_types` entries → our kinds.
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
class ModelConfig:
    """What the engine and the model skeleton read from any family's config. The i-th layer of
    a kind uses layer `kind_indices(layer_kinds)[i]` of that kind's pool. Families subclass it
    (frozen dataclasses with a `from_dict(raw, gen)`), and override `state_layer_specs` if they
    have state layers, `layer_window` / `attn_scale` / `embed_scale` / `final_softcap` where
    they differ from the plain decoder."""

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
    # The model-level window (None if the checkpoint has none): what "swa" layers apply.
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

    def layer_window(self, index: int) -> int | None:
        """The window attention layer `index` applies (None: full causal attention)."""
        return self.sliding_window if self.layer_kinds[index] == "swa" else None

    @property
    def attn_scale(self) -> float:
        """The attention score scale of every attention layer."""
        return float(self.head_dim**-0.5)

    @property
    def embed_scale(self) -> float | None:
        """What the embeddings are multiplied by (None: nothing)."""
        return None

    @property
    def final_softcap(self) -> float | None:
        """Final logit soft-capping: cap * tanh(logits / cap) (None: none)."""
        return None

    def layer_groups(self) -> dict[str, LayerGroupSpec]:
        """Kind -> what this model's layers of that kind keep, for each kind it has layers of
        (FULL and SWA attention, STATE); a family with a new kind of layer adds its group."""
        groups: dict[str, LayerGroupSpec] = {}
        for kind, window in ((FULL, None), (SWA, self.sliding_window)):
            if n := self.count(kind):
                groups[kind] = KVGroupSpec(n, self.num_kv_heads, self.head_dim, window)
        if states := self.state_layer_specs():
            groups[STATE] = StateGroupSpec(states)
        return groups

    def pool_spec(self) -> PoolSpec:
        """The kinds (and shapes) of memory this model reads and writes."""
        return PoolSpec(self.layer_groups())

    def pool_config(
        self, num_slots: int, dtype: torch.dtype = torch.float32, device: str = "cpu"
    ) -> KVPoolConfig:
        """The pool of the FULL component (of the SWA one for an all-sliding model): what a bare
        `KVPool` passed as the model's pools must be; see `pool_spec` for every component."""
        layers = self.count("full") or self.count("swa")
        return KVPoolConfig(layers, self.num_kv_heads, self.head_dim, num_slots, dtype, device)


@dataclass(frozen=True)
class LlamaConfig(ModelConfig):
    """A Llama-family checkpoint: the base fields plus the family's flags. `layer_kinds` is
    "swa" for every layer of an all-sliding model (Mistral), else "full" for all: a model mixing
    windowed and full layers (Qwen2/3 `max_window_layers`) keeps every layer in the FULL pool,
    where `layer_windows[i]` (the window layer i applies, None = full causal) is applied by
    attention."""

    intermediate_size: int
    rope_theta: float
    # None, or a dict of the llama3/linear parameters (HF `rope_scaling` / `rope_parameters`).
    rope_scaling: tuple[tuple[str, Any], ...] | None
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    layer_windows: tuple[int | None, ...]

    def layer_window(self, index: int) -> int | None:
        return self.layer_windows[index]

    @property
    def rope_scaling_dict(self) -> dict[str, Any] | None:
        return None if self.rope_scaling is None else dict(self.rope_scaling)

    @classmethod
    def from_dict(
        cls, raw: dict[str, Any], generation_config: dict[str, Any] | None = None
    ) -> LlamaConfig:
        """Parse an HF config dict; raises UnsupportedArchitectureError for anything else."""
        arch = architecture(raw)
        if arch not in LLAMA_ARCHITECTURES:
            family(arch)  # unsupported: raises naming the supported ones
            raise UnsupportedArchitectureError(f"{arch} is not a Llama-family architecture")
        base = base_fields(raw, generation_config)
        theta, scaling = _parse_rope(raw, arch)
        sliding, layer_windows = _parse_windows(raw, arch, base["num_layers"])
        w = layer_windows
        all_sliding = bool(w) and w[0] is not None and all(x == w[0] for x in w)
        return cls(
            **base,
            intermediate_size=int(raw["intermediate_size"]),
            rope_theta=theta,
            rope_scaling=None if scaling is None else tuple(sorted(scaling.items())),
            qkv_bias=arch == "Qwen2ForCausalLM" or bool(raw.get("attention_bias", False)),
            o_bias=arch != "Qwen2ForCausalLM" and bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            sliding_window=sliding,
            layer_windows=layer_windows,
            layer_kinds=("swa" if all_sliding else "full",) * base["num_layers"],
        )

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str]) -> LlamaConfig:
        root = Path(path)
        raw = json.loads((root / "config.json").read_text())
        gen_path = root / "generation_config.json"
        gen = json.loads(gen_path.read_text()) if gen_path.exists() else {}
        return cls.from_dict(raw, gen)


def _opt_int(value: Any) -> int | None:
    if isinstance(value, list):
        value = value[0] if value else None
    return None if value is None else int(value)


def _eos_ids(raw: dict[str, Any], gen: dict[str, Any]) -> tuple[int, ...]:
    """Union of config and generation-config EOS ids, config order first, no duplicates."""
    ids: list[int] = []
    for value in (raw.get("eos_token_id"), gen.get("eos_token_id")):
        for item in value if isinstance(value, list) else [value]:
            if item is not None and int(item) not in ids:
                ids.append(int(item))
    return tuple(ids)


def base_fields(raw: dict[str, Any], gen: dict[str, Any] | None) -> dict[str, Any]:
    """The fields every family's config has, parsed one way from an HF config dict (and its
    generation config): shapes, norm epsilon, tied embeddings, EOS / BOS ids, stored dtype."""
    num_heads = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    g = gen or {}
    return dict(
        architecture=architecture(raw),
        num_layers=int(raw["num_hidden_layers"]),
        hidden_size=hidden,
        vocab_size=int(raw["vocab_size"]),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        num_heads=num_heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
        head_dim=int(raw.get("head_dim") or hidden // num_heads),
        rms_norm_eps=float(raw.get("rms_norm_eps", raw.get("norm_eps", 1e-6))),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        eos_token_ids=_eos_ids(raw, g),
        bos_token_id=_opt_int(g.get("bos_token_id", raw.get("bos_token_id"))),
        torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
    )


def _parse_rope(raw: dict[str, Any], arch: str) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling) from legacy `rope_theta`/`rope_scaling` or v5 `rope_parameters`."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    theta = float(raw.get("rope_theta") or params.get("rope_theta") or 10000.0)
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedArchitectureError(
            f"{arch}: unsupported rope scaling type {rope_type!r}; "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type == "default":
        return theta, None
    scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "type")}
    scaling["rope_type"] = rope_type
    return theta, scaling


def _parse_windows(
    raw: dict[str, Any], arch: str, num_layers: int
) -> tuple[int | None, tuple[int | None, ...]]:
    """Per-layer sliding windows, following HF semantics for each family."""
    window = raw.get("sliding_window")
    layer_types = raw.get("layer_types")
    if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        if not raw.get("use_sliding_window", False):
            return None, (None,) * num_layers
        if layer_types is None:
            first = int(raw.get("max_window_layers", num_layers))
            layer_types = [
                "sliding_attention" if i >= first else "full_attention" for i in range(num_layers)
            ]
    if window is None:
        return None, (None,) * num_layers
    window = int(window)
    if layer_types is None:
        return window, (window,) * num_layers
    return window, tuple(window if t == "sliding_attention" else None for t in layer_types)

"""The Llama family's configuration parsed from a Hugging Face `config.json`, and the parsing
helpers every family's config shares.

One frozen dataclass covers the Llama family (Llama/SmolLM2, Qwen2, Qwen3, Mistral); the
per-family differences are plain flags (`qkv_bias`, `qk_norm`, per-layer sliding windows), so the
model code has no architecture switch statements. Which class parses which architecture is
radixkv.model.registry's table.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from radixkv.memory.hybrid import PoolSpec
from radixkv.memory.pool import KVPoolConfig
from radixkv.model.registry import LLAMA_ARCHITECTURES as LLAMA_ARCHITECTURES
from radixkv.model.registry import UnsupportedArchitectureError as UnsupportedArchitectureError
from radixkv.model.registry import architecture, family

SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", "llama3", "linear")


@dataclass(frozen=True)
class LlamaConfig:
    """Everything the model, the KV pool and the engine need to know about a Llama-family
    checkpoint."""

    architecture: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    # None, or a dict of the llama3/linear parameters (HF `rope_scaling` / `rope_parameters`).
    rope_scaling: tuple[tuple[str, Any], ...] | None
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    # Model-level window (None if the checkpoint has none); `layer_windows[i]` is the window that
    # layer i actually applies (None = full causal attention).
    sliding_window: int | None
    layer_windows: tuple[int | None, ...]
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    torch_dtype: str | None

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """ "swa" for every layer of an all-sliding model (Mistral), else "full" for all: a model
        mixing windowed and full layers (Qwen2/3 `max_window_layers`) keeps every layer in the
        FULL pool, where the window is applied by attention."""
        w = self.layer_windows
        if w and w[0] is not None and all(x == w[0] for x in w):
            return ("swa",) * self.num_layers
        return ("full",) * self.num_layers

    def pool_spec(self) -> PoolSpec:
        """The components this model needs: FULL only, or SWA only (all-sliding)."""
        swa = self.layer_kinds[0] == "swa" if self.num_layers else False
        return PoolSpec(
            num_full_layers=0 if swa else self.num_layers,
            num_swa_layers=self.num_layers if swa else 0,
            swa_window=self.layer_windows[0] if swa else None,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
        )

    def pool_config(
        self, num_slots: int, dtype: torch.dtype = torch.float32, device: str = "cpu"
    ) -> KVPoolConfig:
        """The KV pool shape this model reads and writes (all layers; with `pool_spec`'s
        components, this is the FULL pool, or the SWA pool of an all-sliding model)."""
        return KVPoolConfig(
            num_layers=self.num_layers,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            num_slots=num_slots,
            dtype=dtype,
            device=device,
        )

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

"""`load_model`: an HF checkpoint directory → model + config + tokenizer."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Any

import torch

from radixkv.model.attention import AttentionBackend, select_backend
from radixkv.model.config import HYBRID_ARCHITECTURES, ModelConfig
from radixkv.model.hybrid import HybridConfig, HybridLM
from radixkv.model.llama import CausalLM
from radixkv.model.tokenizer import Tokenizer
from radixkv.model.weights import SafetensorsWeights

# Hybrid architecture → (module, config class, model class) under radixkv.model.
FAMILIES: dict[str, tuple[str, str, str]] = {
    "Gemma3ForCausalLM": ("gemma3", "Gemma3Config", "Gemma3LM"),
    "Qwen3_5ForCausalLM": ("qwen3_5", "Qwen35Config", "Qwen35LM"),
    "Lfm2ForCausalLM": ("lfm2", "Lfm2Config", "Lfm2LM"),
    "Qwen3NextForCausalLM": ("qwen3_next", "Qwen3NextConfig", "Qwen3NextLM"),
}
assert set(FAMILIES) == set(HYBRID_ARCHITECTURES)


def _family(arch: str) -> tuple[Any, Callable[..., HybridLM]]:
    module, config_cls, model_cls = FAMILIES[arch]
    mod = import_module(f"radixkv.model.{module}")
    return getattr(mod, config_cls), getattr(mod, model_cls)


def load_config(path: str | os.PathLike[str]) -> ModelConfig | HybridConfig:
    """The config of any supported checkpoint (UnsupportedArchitectureError otherwise)."""
    root = Path(path)
    raw = json.loads((root / "config.json").read_text())
    gen_path = root / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.exists() else {}
    archs = raw.get("architectures") or []
    if archs and archs[0] in FAMILIES:
        config_cls, _ = _family(archs[0])
        config: HybridConfig = config_cls.from_dict(raw, gen)
        return config
    return ModelConfig.from_dict(raw, gen)


@dataclass
class LoadedModel:
    """`model(batch, pools)`: pools is a `memory.hybrid.ModelPools` built from
    `config.pool_spec()`; Llama-family models also take a bare KVPool (their one component)."""

    model: CausalLM | HybridLM
    config: ModelConfig | HybridConfig
    tokenizer: Tokenizer
    path: Path
    generation_config: dict[str, Any] = field(default_factory=dict)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def device(self) -> torch.device:
        return self.model.device


def default_dtype(device: str) -> torch.dtype:
    """float32 on CPU (exact, and see the bf16 measurements in the report); bfloat16 elsewhere."""
    return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16


def load_model(
    path: str | os.PathLike[str] | None = None,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    attention: AttentionBackend | None = None,
) -> LoadedModel:
    """Load a Llama-family or hybrid (FAMILIES) HF checkpoint, or an embedded model by short name
    (radixkv.model.embedded: "gemma3-270m"; None → the embedded SmolLM2-135M-Instruct).

    Raises UnsupportedArchitectureError for other architectures, before reading any weights.
    """
    from radixkv.model.embedded import resolve_model

    root = resolve_model(path)
    gen_path = root / "generation_config.json"
    generation_config: dict[str, Any] = (
        json.loads(gen_path.read_text()) if gen_path.exists() else {}
    )
    config = load_config(root)
    dtype = dtype or default_dtype(device)
    weights = SafetensorsWeights(root, dtype=dtype, device=device)
    backend = attention or select_backend(device)
    model: CausalLM | HybridLM
    if isinstance(config, ModelConfig):
        model = CausalLM(config, weights.get, device=device, attention=backend)
    else:
        _, model_cls = _family(config.architecture)
        model = model_cls(config, weights.get, device=device, attention=backend)
    allowed = {"lm_head.weight"} if config.tie_word_embeddings else set()
    leftover = weights.unused(allowed)
    weights.close()
    if leftover:
        raise ValueError(
            f"{root}: checkpoint tensors not used by {config.architecture}: {leftover[:5]}"
        )
    model.eval()
    tokenizer = Tokenizer.from_pretrained(root, extra_eos_ids=config.eos_token_ids)
    return LoadedModel(
        model=model,
        config=config,
        tokenizer=tokenizer,
        path=root,
        generation_config=generation_config,
    )

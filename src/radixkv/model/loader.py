"""`load_model`: an HF checkpoint directory → model + config + tokenizer."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from radixkv.model.attention import AttentionBackend, select_backend
from radixkv.model.checkpoints.weights import SafetensorsWeights
from radixkv.model.config import ModelConfig
from radixkv.model.families.skeleton import DecoderLM
from radixkv.model.registry import family, load_config
from radixkv.model.tokenizer import Tokenizer

__all__ = ["LoadedModel", "default_dtype", "load_config", "load_model"]


@dataclass
class LoadedModel:
    """`model(batch, pools)`: pools is a `memory.hybrid.ModelPools` built from
    `config.pool_spec()`; a model with one attention component and no state layers also takes
    a bare KVPool (that component)."""

    model: DecoderLM[Any]
    config: ModelConfig
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
    """Load an HF checkpoint of any architecture in radixkv.model.registry, or an embedded model
    by short name (radixkv.model.checkpoints.embedded: "gemma3-270m"; None → the embedded
    SmolLM2-135M-Instruct).

    Raises UnsupportedArchitectureError for other architectures, before reading any weights.
    """
    from radixkv.model.checkpoints.embedded import resolve_model

    root = resolve_model(path)
    gen_path = root / "generation_config.json"
    generation_config: dict[str, Any] = (
        json.loads(gen_path.read_text()) if gen_path.exists() else {}
    )
    config = load_config(root)
    dtype = dtype or default_dtype(device)
    weights = SafetensorsWeights(root, dtype=dtype, device=device)
    backend = attention or select_backend(device)
    model_cls = family(config.architecture).model_class()
    model: DecoderLM[Any] = model_cls(config, weights.get, device=device, attention=backend)
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

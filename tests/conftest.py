"""Shared pytest fixtures.

`tiny_model_dir(arch="llama", **config_overrides) -> Path` (session-scoped factory)
    A tiny, seeded, randomly initialised HF checkpoint saved with `save_pretrained`
    (safetensors), for fast model/engine/server tests: built once per session and key (a few
    seconds, mostly importing transformers); `radixkv.model.load_model(path)` then takes ~0.3 s.
    `arch` is one of "llama", "qwen2", "qwen3", "mistral", or a hybrid "gemma3", "qwen3_5",
    "lfm2", "qwen3_next" (their layer mixes: HYBRID_TINY). Shape: hidden 64, 2 layers
    (hybrids 3-4), 4 query heads, 2 KV heads (head_dim 16), intermediate 128, vocab 49152, max
    positions 1024; Mistral has sliding_window=8 so short sequences already run past the
    window. Keyword overrides go to the transformers config class (e.g.
    `tie_word_embeddings=True`, `num_hidden_layers=3`).
    The directory also holds a WORKING tokenizer: the default model's converted SmolLM2 tokenizer
    (tokenizer.json, tokenizer_config.json with chat template, chat_template.jinja), so vocab ids
    match (eos = <|im_end|> = 2); producing it converts the embedded default model once into
    $RADIXKV_CACHE_DIR (default ~/.cache/radixkv/models).
    Weights use initializer_range=0.2 so attention is peaked and masking mistakes show up in
    logits; generated text from these models is gibberish by design.

`default_model_dir() -> Path` (session-scoped)
    The converted embedded default model (SmolLM2-135M-Instruct, float32 HF checkpoint).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

# Exactness tests compare float32 outputs: `--dtype auto` stays float32 even on CPUs with native
# bf16, so the suite behaves the same on every machine (subprocesses inherit this).
os.environ.setdefault("RADIXKV_AUTO_BF16", "0")
# The Triton kernels (radixkv.model.triton) run under Triton's interpreter where no GPU is visible.
# Triton reads this when it is first imported (importing torch does not import it), so it is set
# here, before any test can; with a GPU they run compiled on it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

TINY_ARCHS: tuple[str, ...] = (
    "llama",
    "qwen2",
    "qwen3",
    "mistral",
    "gemma3",
    "qwen3_5",
    "lfm2",
    "qwen3_next",
)
# Hybrid tiny models: a few layers of each kind, windows/kernels short enough for short tests.
HYBRID_TINY: dict[str, dict[str, Any]] = {
    "gemma3": {
        "num_hidden_layers": 4,
        "layer_types": [
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "sliding_attention",
        ],
        "sliding_window": 8,
        "query_pre_attn_scalar": 16,
    },
    "qwen3_5": {
        "num_hidden_layers": 3,
        "layer_types": ["linear_attention", "full_attention", "linear_attention"],
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
    },
    "qwen3_next": {
        "num_hidden_layers": 3,
        "layer_types": ["linear_attention", "full_attention", "linear_attention"],
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "mlp_only_layers": [2],
    },
    "lfm2": {
        "num_hidden_layers": 3,
        "layer_types": ["conv", "full_attention", "conv"],
        "conv_L_cache": 3,
        "norm_eps": 1e-5,
    },
}
TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)

_TINY_BASE: dict[str, Any] = {
    "vocab_size": 49152,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.2,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    "tie_word_embeddings": False,
}


def _config_class(arch: str) -> Any:
    import transformers

    classes = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "mistral": transformers.MistralConfig,
        "gemma3": transformers.Gemma3TextConfig,
        "qwen3_5": transformers.Qwen3_5TextConfig,
        "lfm2": transformers.Lfm2Config,
        "qwen3_next": transformers.Qwen3NextConfig,
    }
    if arch not in classes:
        raise ValueError(f"unknown tiny arch {arch!r}; choose from {TINY_ARCHS}")
    return classes[arch]


def build_tiny_checkpoint(
    out: Path, arch: str, tokenizer_dir: Path | None, seed: int = 0, **overrides: Any
) -> Path:
    """Write a seeded random tiny checkpoint (and the tokenizer files, if given) to `out`."""
    from transformers import AutoModelForCausalLM

    kwargs = dict(_TINY_BASE)
    if arch == "mistral":
        kwargs["sliding_window"] = 8
    kwargs.update(HYBRID_TINY.get(arch, {}))
    if arch == "lfm2":  # LFM2 derives head_dim and names its eps `norm_eps`
        del kwargs["head_dim"], kwargs["rms_norm_eps"]
    kwargs.update(overrides)
    config = _config_class(arch)(**kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = kwargs["eos_token_id"]
    model.save_pretrained(out, safe_serialization=True)
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            if (tokenizer_dir / name).exists():
                shutil.copy(tokenizer_dir / name, out / name)
    return out


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    from radixkv.model import default_model_path

    return Path(default_model_path())


@pytest.fixture(scope="session")
def tiny_model_dir(
    tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path
) -> Callable[..., Path]:
    cache: dict[str, Path] = {}

    def make(arch: str = "llama", **overrides: Any) -> Path:
        key = json.dumps([arch, overrides], sort_keys=True, default=str)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"tiny-{arch}")
            cache[key] = build_tiny_checkpoint(out, arch, default_model_dir, **overrides)
        return cache[key]

    return make

"""Seeded random Llama checkpoints for benchmarks, each built once under the converted-models
folder with the default model's vocabulary and tokenizer. Their answers are noise; what the
benchmarks that use them measure (routing, cache hits, queueing, kernel and serving speed) does
not depend on them.

- `tiny` (`radixkv bench cluster --model tiny`): hidden 64, 2 layers, 4,096 positions, small
  enough that several replicas fit on a CPU machine.
- `tiny-32k` (`radixkv bench agent --model tiny-32k`): the same at 32,768 positions with Llama
  3's rope (theta 500,000, `llama3` scaling of factor 8 over 4,096 original positions): 32k-token
  sessions in seconds.
- `smollm2-shaped` (`scripts/gpu_check.py` on a machine without the default model's package): the
  default model's own config (SmolLM2-135M: 30 layers, hidden 576, 9 / 3 heads of 64, MLP 1,536)
  with seeded random weights, so its speed is the default model's and its exactness check the
  same code path.
- `1b` (`python -m scripts.peers --model 1b`): Llama-3.2-1B's shape (16 layers, hidden 2,048, 32 / 8
  heads of 64, MLP 8,192, rope theta 500,000, tied embeddings) with the default tokenizer's
  49,152-token vocabulary; float32 on disk (about 4.3 GB) so that float32 and bfloat16 servers
  both load it exactly.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TINY_NAME = "tiny"
ONE_B_NAME = "1b"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
# Every checkpoint here speaks the default model's tokenizer: its vocabulary and special ids.
_TOKENIZER_IDS: dict[str, Any] = {
    "vocab_size": 49152,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}


@dataclass(frozen=True)
class SeededLlama:
    """A `transformers.LlamaConfig` (its keyword arguments on top of the tokenizer's ids), the
    seed of its random weights, and the folder it is built in under the converted-models one."""

    dir_name: str
    config: dict[str, Any] = field(default_factory=dict)
    seed: int = 0


TINY = SeededLlama(
    "tiny-llama-4k",
    {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 4096,
    },
)
# The tiny shape at 32k positions, Llama 3's way: rope theta 500,000 and `llama3` frequency
# scaling (factor 8 over an original 4,096 positions), for 32k-token sessions in tests and benches.
TINY_32K = SeededLlama(
    "tiny-llama-32k",
    {
        **TINY.config,
        "max_position_embeddings": 32768,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 4096,
        },
    },
)
LLAMA_1B = SeededLlama(
    "llama-3.2-1b-shaped",
    {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        # Llama 3.2's own: with RMS-normed inputs every projection's output stays near unit
        # scale, so attention and logits are neither flat nor saturated.
        "initializer_range": 0.02,
    },
)
SMOLLM2_SHAPED = SeededLlama(
    "smollm2-135m-shaped",
    {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "max_position_embeddings": 8192,
        "rope_theta": 100000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
    },
)
TINY_32K_NAME = "tiny-32k"
SMOLLM2_SHAPED_NAME = "smollm2-shaped"
MODELS: dict[str, SeededLlama] = {
    TINY_NAME: TINY,
    TINY_32K_NAME: TINY_32K,
    ONE_B_NAME: LLAMA_1B,
    SMOLLM2_SHAPED_NAME: SMOLLM2_SHAPED,
}


def seeded_llama(
    spec: SeededLlama,
    out: Path | None = None,
    tokenizer_dir: Path | None = None,
    **overrides: Any,
) -> Path:
    """The checkpoint's directory, built on first use (later calls reuse it, whatever the
    overrides: they are for tests that build a small variant of a shape in their own `out`).
    The tokenizer's files come from `tokenizer_dir`, else from the converted default model."""
    from radixkv.model.checkpoints.gguf_convert import cache_root

    out = out or cache_root() / spec.dir_name
    if (out / "config.json").exists():
        return out
    import torch
    import transformers

    config = transformers.LlamaConfig(**{**_TOKENIZER_IDS, **spec.config, **overrides})
    torch.manual_seed(spec.seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    del model
    if tokenizer_dir is None:
        from radixkv.model import default_model_path

        tokenizer_dir = Path(default_model_path())
    source = Path(tokenizer_dir)
    for name in _TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, tmp / name)
    tmp.rename(out)  # whole or absent: a crashed build is redone
    return out


def tiny_llama(out: Path | None = None) -> Path:
    """The tiny checkpoint's directory (built on first use; later calls reuse it)."""
    return seeded_llama(TINY, out)


def resolve_model(name: str | None, tokenizer_dir: Path | None = None) -> str | None:
    """A name of `MODELS` (`tiny`, `tiny-32k`, `1b`, `smollm2-shaped`) → its checkpoint's path,
    built on first use; anything else unchanged (None: the default model)."""
    spec = MODELS.get(name) if name is not None else None
    return str(seeded_llama(spec, tokenizer_dir=tokenizer_dir)) if spec is not None else name

"""`--model tiny` for the cluster benchmark: a seeded random Llama small enough that several
replicas fit on a CPU machine (hidden 64, 2 layers, the default model's vocabulary and tokenizer,
4,096 positions), built once under the converted-models folder. Its answers are noise; what a
cluster benchmark measures (routing, cache hits, queueing) does not depend on them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

TINY_NAME = "tiny"
_DIR = "tiny-llama-4k"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def tiny_llama(out: Path | None = None) -> Path:
    """The checkpoint's directory (built on first use; later calls reuse it)."""
    from radixkv.model.gguf_convert import cache_root

    out = out or cache_root() / _DIR
    if (out / "config.json").exists():
        return out
    import torch
    import transformers

    from radixkv.model import default_model_path

    config = transformers.LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    source = Path(default_model_path())
    for name in _TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, tmp / name)
    tmp.rename(out)  # whole or absent: a crashed build is redone
    return out


def resolve_model(name: str | None) -> str | None:
    """`tiny` → the tiny checkpoint's path; anything else unchanged (None: the default model)."""
    return str(tiny_llama()) if name == TINY_NAME else name

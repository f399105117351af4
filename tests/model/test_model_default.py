"""The embedded default model: GGUF → HF conversion and its greedy answers vs transformers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from radixkv.model import load_model
from radixkv.model.checkpoints.default import (
    MARKER,
    MODEL_NAME,
    convert_gguf,
    default_model_path,
    gguf_path,
    unpermute_rope_rows,
)
from radixkv.model.simple import greedy_generate

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The permutation llama.cpp's converter applies to Q/K rows (written from its description)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def test_unpermute_inverts_llama_cpp_permutation() -> None:
    w = np.arange(12 * 5, dtype=np.float32).reshape(12, 5)
    for heads in (1, 2, 3):
        assert np.array_equal(unpermute_rope_rows(_llama_cpp_permute(w, heads), heads), w)
    assert not np.array_equal(_llama_cpp_permute(w, 3), w)


def test_default_path_is_cached_and_complete(default_model_dir: Path) -> None:
    assert default_model_dir.name == MODEL_NAME
    marker = default_model_dir / MARKER
    before = marker.stat().st_mtime_ns
    assert default_model_path() == default_model_dir
    assert marker.stat().st_mtime_ns == before  # not converted again
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (default_model_dir / name).exists()
    tok_cfg = json.loads((default_model_dir / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_cfg["chat_template"]
    assert not any(p.name.startswith(".") for p in default_model_dir.parent.iterdir()), "temp left"


def test_cache_dir_env_var(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from radixkv.model.checkpoints.default import cache_root

    monkeypatch.setenv("RADIXKV_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path
    monkeypatch.delenv("RADIXKV_CACHE_DIR")
    assert cache_root() == Path.home() / ".cache" / "radixkv" / "models"


@pytest.mark.slow
def test_conversion_replaces_partial_dir_atomically(tmp_path: Path) -> None:
    target = tmp_path / MODEL_NAME
    target.mkdir()
    (target / "config.json").write_text("{}")  # a crashed earlier attempt: no marker
    convert_gguf(gguf_path(), target)
    assert (target / MARKER).exists()
    assert sorted(os.listdir(tmp_path)) == [MODEL_NAME]


@pytest.mark.slow
def test_weights_equal_transformers_gguf_loader(default_model_dir: Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(default_model_dir))
    ref = load_gguf_checkpoint(str(gguf_path()), return_tensors=True, model_to_load=skeleton)
    theirs = ref["tensors"]
    ours = load_file(str(default_model_dir / "model.safetensors"))
    assert set(ours) == set(theirs)
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor.float()), name
    cfg = json.loads((default_model_dir / "config.json").read_text())
    for key in ("num_hidden_layers", "hidden_size", "num_key_value_heads", "rope_theta"):
        assert cfg[key] == ref["config"][key]


@pytest.mark.slow
def test_greedy_answer_matches_transformers(default_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    lm = load_model(None)
    ids = lm.tokenizer.apply_chat_template(QUESTION)
    ours = greedy_generate(lm, ids, max_new_tokens=24)
    hf = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)
    theirs = out[0, len(ids) :].tolist()
    assert ours == theirs
    assert "Paris" in lm.tokenizer.decode(ours)

"""The seeded benchmark checkpoints (`radixkv.bench.tiny_model`): the 1B shape's recipe, built
here on a small override of that shape by the same code path (the real one is 4.3 GB), loaded in
both dtypes, reused once built, and the same bits from the same seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from radixkv.bench import tiny_model
from radixkv.bench.tiny_model import LLAMA_1B, MODELS, SeededLlama, resolve_model, seeded_llama

# The 1B recipe at a size a test builds in a second: only the widths and depth shrink.
SMALL = {
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 16,
}


def test_the_1b_recipe_is_llama_3_2_1b_with_the_default_tokenizer() -> None:
    c = LLAMA_1B.config
    shape = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads")
    assert [c[k] for k in shape] == [16, 2048, 32, 8]
    assert (c["head_dim"], c["intermediate_size"], c["rope_theta"]) == (64, 8192, 500000.0)
    assert c["tie_word_embeddings"] is True and c["max_position_embeddings"] >= 8192
    assert MODELS["1b"] is LLAMA_1B and MODELS["tiny"] is tiny_model.TINY


def test_builds_a_small_1b_variant_that_loads_in_both_dtypes(
    tmp_path: Path, default_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from radixkv.model import kernels
    from radixkv.model.config import LlamaConfig
    from radixkv.model.loader import load_model

    # What is checked is the checkpoint, not the kernels: torch's, with no kernel build to wait
    # on (patched, not $RADIXKV_CPU_KERNELS=0, which the process would cache for later tests).
    monkeypatch.setattr(kernels, "cpu_kernels", lambda: None)
    out = seeded_llama(LLAMA_1B, tmp_path / "one-b", **SMALL)
    raw = json.loads((out / "config.json").read_text())
    assert (raw["vocab_size"], raw["bos_token_id"], raw["eos_token_id"]) == (49152, 1, 2)
    assert raw["tie_word_embeddings"] is True and raw["num_hidden_layers"] == 2
    theta = raw.get("rope_theta") or raw["rope_parameters"]["rope_theta"]
    assert theta == 500000.0
    assert raw.get("dtype", raw.get("torch_dtype")) == "float32"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (default_model_dir / name).read_bytes()
    assert not out.with_name("one-b.partial").exists()
    for dtype in (torch.float32, torch.bfloat16):
        lm = load_model(out, "cpu", dtype)
        assert isinstance(lm.config, LlamaConfig) and lm.config.rope_theta == 500000.0
        assert lm.config.tie_word_embeddings
        assert lm.dtype == dtype and lm.config.num_kv_heads == 1


def test_built_once_and_seeded(tmp_path: Path) -> None:
    spec = SeededLlama("s", {**LLAMA_1B.config, **SMALL, "num_hidden_layers": 1})
    first = seeded_llama(spec, tmp_path / "a")
    weights = (first / "model.safetensors").read_bytes()
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert seeded_llama(spec, tmp_path / "a") == first  # reused, not rebuilt
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert (seeded_llama(spec, tmp_path / "b") / "model.safetensors").read_bytes() == weights


def test_names_resolve_under_the_cache_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RADIXKV_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(MODELS, "1b", SeededLlama("small-1b", {**LLAMA_1B.config, **SMALL}))
    assert resolve_model("1b") == str(tmp_path / "small-1b")
    assert (tmp_path / "small-1b" / "config.json").exists()
    assert resolve_model("/some/dir") == "/some/dir" and resolve_model(None) is None


def test_the_smollm2_shape_is_the_default_models_config(default_model_dir: Path) -> None:
    """`smollm2-shaped` (the device check's stand-in for the default model, whose package a
    device machine lacks) has the converted default model's shape, key for key."""
    raw = json.loads((default_model_dir / "config.json").read_text())
    spec = MODELS["smollm2-shaped"].config
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "max_position_embeddings", "rope_theta", "rms_norm_eps",
                "tie_word_embeddings"):  # fmt: skip
        assert spec[key] == raw[key], key
    assert spec.get("head_dim", raw["hidden_size"] // raw["num_attention_heads"]) == 64


def test_the_tokenizer_comes_from_a_given_folder(tmp_path: Path, default_model_dir: Path) -> None:
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_bytes((default_model_dir / "tokenizer.json").read_bytes())
    spec = SeededLlama("s", {**LLAMA_1B.config, **SMALL, "num_hidden_layers": 1})
    out = seeded_llama(spec, tmp_path / "m", tokenizer_dir=tok)
    assert (out / "tokenizer.json").read_bytes() == (tok / "tokenizer.json").read_bytes()
    assert not (out / "tokenizer_config.json").exists()  # only what the folder has

"""Gemma 3 270M, the embedded hybrid model (`--model gemma3-270m`): its GGUF → HF conversion (the
+1 norm offsets, names, layer pattern, rope bases, tokenizer and chat template), and greedy output
and log-probabilities through RadixKV's engine, cache on, equal to transformers on the converted
checkpoint in float32, with prompts longer than the 512-token sliding window that hit the cache
past the window. Skipped, saying why, when the package is not installed (install.sh --test
installs it)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from radixkv.model.checkpoints.gemma3_gguf import INSTALL_HINT, hf_name, package_installed
from radixkv.model.checkpoints.gguf_convert import MARKER

pytestmark = pytest.mark.skipif(
    not package_installed(),
    reason=f"the Gemma 3 270M package is not installed (`{INSTALL_HINT}`; install.sh --test)",
)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WINDOW = 512


@pytest.fixture(scope="module")
def gemma_dir() -> Path:
    from radixkv.model.checkpoints.embedded import resolve_model

    return resolve_model("gemma3-270m")


def test_tensor_names() -> None:
    assert hf_name("blk.3.ffn_norm.weight") == "model.layers.3.pre_feedforward_layernorm.weight"
    assert hf_name("blk.0.post_ffw_norm.weight").endswith(".0.post_feedforward_layernorm.weight")
    assert hf_name("blk.17.attn_k_norm.weight") == "model.layers.17.self_attn.k_norm.weight"
    assert hf_name("output_norm.weight") == "model.norm.weight"
    with pytest.raises(ValueError, match="unexpected"):
        hf_name("output.weight")  # Gemma 3 ties its head


def test_short_name_converts_once_with_gemma3_metadata(gemma_dir: Path) -> None:
    from radixkv.model.checkpoints.embedded import resolve_model
    from radixkv.model.loader import load_config

    marker = gemma_dir / MARKER
    before = marker.stat().st_mtime_ns
    assert resolve_model("gemma3-270m") == gemma_dir
    assert marker.stat().st_mtime_ns == before  # not converted again
    assert not any(p.name.startswith(".") for p in gemma_dir.parent.iterdir()), "temp left"
    cfg = json.loads((gemma_dir / "config.json").read_text())
    assert cfg["sliding_window"] == WINDOW and cfg["num_hidden_layers"] == 18
    full = [i for i, t in enumerate(cfg["layer_types"]) if t == "full_attention"]
    assert full == [5, 11, 17]
    assert cfg["rope_parameters"]["sliding_attention"]["rope_theta"] == 10_000.0
    assert cfg["rope_parameters"]["full_attention"]["rope_theta"] == 1_000_000.0
    assert cfg["query_pre_attn_scalar"] == 256 and cfg["tie_word_embeddings"]
    parsed = load_config(gemma_dir)
    assert parsed.architecture == "Gemma3ForCausalLM"
    assert parsed.layer_kinds.count("full") == 3 and parsed.sliding_window == WINDOW


def test_tokenizer_and_chat_template_match_transformers(gemma_dir: Path) -> None:
    from transformers import AutoTokenizer

    from radixkv.model.tokenizer import Tokenizer

    ours = Tokenizer.from_pretrained(gemma_dir, extra_eos_ids=(106,))
    theirs = AutoTokenizer.from_pretrained(gemma_dir)
    chat = [{"role": "system", "content": "Be brief."}, *QUESTION]
    chat += [{"role": "assistant", "content": " Paris. "}, {"role": "user", "content": "And?"}]
    want = theirs.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    got = ours.apply_chat_template(chat)
    assert got == list(want)
    text = ours.render_chat(chat)
    assert text.startswith("<bos><start_of_turn>user\nBe brief.\n\nWhat is")
    assert "<start_of_turn>model\nParis.<end_of_turn>\n" in text
    assert text.endswith("<start_of_turn>model\n")
    assert got[:3] == [2, 105, 2364]  # <bos> <start_of_turn> user
    for s in ("Hello world!", "  two spaces\n\ttab ünïcödé 日本語 🙂", "def f(x):\n    return x"):
        assert ours.encode(s) == theirs(s, add_special_tokens=False)["input_ids"]
        assert ours.decode(ours.encode(s)) == s
    assert set(ours.eos_token_ids) == {1, 106}  # <eos>, <end_of_turn>


@pytest.mark.slow
def test_weights_equal_transformers_gguf_loader(gemma_dir: Path, tmp_path: Path) -> None:
    """Every tensor equals what transformers' own GGUF loader makes of the same file (its
    Gemma processor also subtracts the +1 norm offset): an independent dequantization."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from radixkv.model.checkpoints.gemma3_gguf import assemble_gguf

    gguf = assemble_gguf(tmp_path)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(gemma_dir))
    ref = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton)
    os.unlink(gguf)
    theirs = ref["tensors"]
    ours = load_file(str(gemma_dir / "model.safetensors"))
    assert set(ours) == set(theirs)
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor.float()), name
    norm = ours["model.layers.0.post_attention_layernorm.weight"]
    assert float(norm.min()) == -1.0  # stored as 1 + w in the GGUF: the offset is undone
    for key in ("num_hidden_layers", "hidden_size", "num_key_value_heads", "sliding_window"):
        assert json.loads((gemma_dir / "config.json").read_text())[key] == ref["config"][key]


def _long_text(n_items: int, salt: str) -> str:
    words = ("river", "stone", "lantern", "orchard", "violet", "harbor", "copper", "meadow")
    lines = [
        f"{i}. The {words[i % 8]} near {salt} house {i * 7 % 13} keeps {words[(i * 3) % 8]}s."
        for i in range(n_items)
    ]
    return "Notes from the survey:\n" + "\n".join(lines) + "\nSummary:"


def _hf_greedy(hf: Any, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    logprobs = [torch.log_softmax(x[0].float(), dim=-1) for x in out.logits]
    return out.sequences[0, len(prompt) :].tolist(), logprobs


@pytest.mark.slow
def test_engine_greedy_and_logprobs_equal_transformers(gemma_dir: Path) -> None:
    """Through the engine with the radix cache on and an SWA pool smaller than the FULL one:
    a chat prompt, a raw one, a prompt of ~770 tokens (past the window), and one sharing its
    first 600 tokens, which must come from the cache although the SWA pool, at its least (window
    + one chunk + 2 pages), had to drop out-of-window SWA KV of what the tree keeps: trimming
    frees the pages furthest back first, so the window before token 592 survives."""
    from transformers import AutoModelForCausalLM

    from radixkv.engine.engine import Engine
    from radixkv.engine.types import SamplingParams

    engine = Engine(
        "gemma3-270m",
        device="cpu",
        dtype="float32",
        page_size=16,
        num_slots=4096,
        swa_num_slots=WINDOW + 256 + 2 * 16,
        chunked_prefill_size=256,
        max_running_requests=2,
    )
    assert engine.lm.path == gemma_dir
    tok = engine.tokenizer
    long_a = [2, *tok.encode(_long_text(50, "the old"))]
    long_b = long_a[:600] + tok.encode(" Other notes: the harbor has boats.")
    assert len(long_a) > WINDOW + 256 and long_a[600:] != long_b[600:]
    prompts = [tok.apply_chat_template(QUESTION), [2, *tok.encode("The capital of France is")]]
    prompts += [long_a, long_b]
    hf = AutoModelForCausalLM.from_pretrained(gemma_dir, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # 32 tokens each, like ignore_eos
    n = 32
    sp = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=3)
    cached, texts = [], []
    for prompt in prompts:  # one at a time: later prompts hit what earlier ones left
        (out,) = engine.generate([prompt], sp)
        engine.check_memory()
        want, ref = _hf_greedy(hf, prompt, n)
        assert out.output_token_ids == want, f"prompt of {len(prompt)} tokens"
        assert out.logprobs is not None and len(out.logprobs) == n
        for i, (lp, top) in enumerate(out.logprobs):
            assert abs(lp - float(ref[i][want[i]])) < 2e-3, (len(prompt), i)
            for tid, tlp in top:
                assert abs(tlp - float(ref[i][tid])) < 2e-3, (len(prompt), i, tid)
        cached.append(out.cached_tokens)
        texts.append(tok.decode(out.output_token_ids))
    assert cached[3] >= 592  # whole 16-token pages of the shared 600, past the window
    pools = engine.metrics().component_pools
    assert pools["swa"]["cached"] < pools["full"]["cached"]  # SWA KV dropped outside windows
    assert "France" in texts[1]  # " the capital of the country of France. It is ..."

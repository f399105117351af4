"""Hybrid models (Gemma 3, Qwen3.5, LFM2, and Mistral on the SWA component) vs transformers' full
forward in float32, run over their component pools through the standalone Session driver.

Slots of every component are handed out in a seeded random order and SWA slots are freed (table
entries set to -1) as soon as they leave the window, so a model is only right if it reads each
component by slot, never reads a freed position, and carries its recurrent/conv state exactly
across chunks, decode steps, checkpoints and forks.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from radixkv.model import LoadedModel, load_model
from radixkv.model.hybrid_simple import Session, greedy_generate_hybrid

ARCHS = ("gemma3", "qwen3_5", "lfm2", "qwen3_next", "mistral")
RTOL = 1e-4


@pytest.fixture(scope="module")
def setups(tiny_model_dir: Callable[..., Path]) -> dict[str, tuple[LoadedModel, Any]]:
    from transformers import AutoModelForCausalLM

    out = {}
    for arch in ARCHS:
        path = tiny_model_dir(arch)
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        out[arch] = (load_model(path), hf)
    return out


def reference(hf: Any, toks: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([toks])).logits[0].float()


def assert_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    err = float((ours - ref).abs().max() / ref.abs().max())
    assert err < RTOL, f"relative error {err:.2e}"


def tokens(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 49152, (n,), generator=g).tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_chunks_and_decode(arch: str, setups: dict) -> None:
    """Whole prefill; chunks crossing the window (8) and the DeltaNet chunk (64); decode."""
    lm, hf = setups[arch]
    seq = tokens(90, seed=1)
    ref = reference(hf, seq)
    sess = Session(lm, num_slots=256, num_states=4, seed=0)
    assert_close(sess.step([(sess.new(seq), 90)])[0], ref)
    s = sess.new(seq)
    got = [sess.step([(s, n)])[0] for n in (5, 66, 9)]
    got += [sess.step([(s, 1)])[0] for _ in range(10)]
    assert_close(torch.cat(got), ref)


@pytest.mark.parametrize("arch", ARCHS)
def test_resume_from_checkpoint_and_fork(arch: str, setups: dict) -> None:
    """A prefix already in the pools (KV slots shared, state copied): a fork continues exactly,
    and the original, continuing afterwards, is untouched by the fork's writes."""
    lm, hf = setups[arch]
    prefix = tokens(21, seed=3)
    a, b = prefix + tokens(7, seed=4), prefix + tokens(12, seed=5)
    sess = Session(lm, num_slots=256, num_states=6, seed=1)
    first = sess.new(a)
    sess.step([(first, 21)])
    ckpt = sess.checkpoint(first)
    sess.step([(first, 7)])
    second = sess.fork(ckpt, b[21:])
    got = sess.step([(second, 5)])[0]
    got = torch.cat([got, *[sess.step([(second, 1)])[0] for _ in range(7)]])
    assert_close(got, reference(hf, b)[21:])
    # The original decodes on from its own state; a third fork starts a second branch.
    first.tokens.append(77)
    assert_close(sess.step([(first, 1)])[0], reference(hf, [*a, 77])[-1:])
    third = sess.fork(ckpt, [5, 6, 7])
    assert_close(sess.step([(third, 3)])[0], reference(hf, [*prefix, 5, 6, 7])[21:])


@pytest.mark.parametrize("arch", ARCHS)
def test_ragged_and_mixed_batches(arch: str, setups: dict) -> None:
    lm, hf = setups[arch]
    seqs = [tokens(n, seed=10 + n) for n in (17, 5, 26, 3)]
    refs = [reference(hf, s) for s in seqs]
    sess = Session(lm, num_slots=256, num_states=8, seed=2)
    state = sess.pools.state()
    if state is not None:  # stale garbage in working slots must be ignored at prefix 0
        for layer in state.tensors:
            for t in layer.values():
                t.fill_(3.0)
    r = [sess.new(s) for s in seqs]
    # Step 1: ragged prefill (the third only partly: chunked), plus a one-token prompt.
    got = sess.step([(r[0], 15), (r[1], 4), (r[2], 20), (r[3], 1)])
    # Step 2: decodes of different context lengths beside a prefill chunk.
    got2 = sess.step([(r[0], 1), (r[1], 1), (r[2], 4), (r[3], 1)])
    # Step 3: pure batched decode.
    got3 = sess.step([(r[0], 1), (r[2], 1), (r[3], 1)])
    assert_close(torch.cat([got[0], got2[0], got3[0]]), refs[0][:17])
    assert_close(torch.cat([got[1], got2[1]]), refs[1])
    assert_close(torch.cat([got[2], got2[2], got3[1]]), refs[2][:25])
    assert_close(torch.cat([got[3], got2[3], got3[2]]), refs[3])


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_transformers_generate(arch: str, setups: dict) -> None:
    lm, hf = setups[arch]
    prompt = tokens(19, seed=9)
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None
        )
    want = out[0, len(prompt) :].tolist()
    assert greedy_generate_hybrid(lm, prompt, 12, chunk_size=6, stop_at_eos=False) == want


def test_gemma3_window_is_applied(setups: dict, tiny_model_dir: Callable[..., Path]) -> None:
    """Past the window the sliding layers must differ from the same weights without a window."""
    lm, _ = setups["gemma3"]
    assert lm.config.layer_kinds == ("swa", "full", "swa", "swa")
    seq = tokens(20, seed=7)

    def run(model: LoadedModel) -> torch.Tensor:
        sess = Session(model)
        return sess.step([(sess.new(seq), 20)])[0]

    windowed, full = run(lm), run(load_model(tiny_model_dir("gemma3", sliding_window=64)))
    assert torch.allclose(windowed[:8], full[:8], rtol=1e-5, atol=1e-5)
    assert (windowed[9:] - full[9:]).abs().max() > 1e-2


def test_gemma3_softcapping_and_scaled_global_rope(tiny_model_dir: Callable[..., Path]) -> None:
    """Final logit soft-capping, and the larger Gemma 3s' linearly scaled RoPE on full layers
    (a different base per layer kind)."""
    from transformers import AutoModelForCausalLM

    rope = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    }
    path = tiny_model_dir("gemma3", final_logit_softcapping=2.0, rope_parameters=rope)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    lm = load_model(path)
    assert dict(lm.config.rope_full[1] or {}).get("factor") == 8.0
    seq = tokens(12, seed=8)
    sess = Session(lm)
    got = sess.step([(sess.new(seq), 12)])[0]
    assert float(got.abs().max()) <= 2.0
    assert_close(got, reference(hf, seq))

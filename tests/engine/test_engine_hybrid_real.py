"""Hybrid checkpoints (Gemma 3, Qwen3.5, LFM2, Mistral on SWA) through the engine: greedy output
equals transformers' generate with the cache off and on, including hits after a divergence in
the middle of a cached edge, at page sizes 1 and 16, with the census of every pool checked after
every step. Skipped where the hybrid model families are not installed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_helpers import run_checked

from radixkv.engine.engine import Engine
from radixkv.engine.kv.plain_memory import PlainMemory
from radixkv.engine.types import SamplingParams

pytest.importorskip("radixkv.model.families.qwen3_5")

ARCHS = ("gemma3", "qwen3_5", "lfm2", "mistral")


def _tokens(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 1000, (n,), generator=g).tolist()


def _hf_greedy(hf: Any, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]), max_new_tokens=n, do_sample=False, min_new_tokens=n
        )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def hf_models(tiny_model_dir: Callable[..., Path]) -> dict[str, tuple[Path, Any]]:
    from transformers import AutoModelForCausalLM

    out = {}
    for arch in ARCHS:
        path = tiny_model_dir(arch)
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        out[arch] = (path, hf)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("page_size", [1, 16])
def test_hybrid_engine_greedy_equals_transformers(
    arch: str, page_size: int, hf_models: dict[str, tuple[Path, Any]]
) -> None:
    path, hf = hf_models[arch]
    trunk = _tokens(70, seed=2)
    prompts = [
        trunk + _tokens(30, seed=3),
        trunk[:50] + _tokens(20, seed=4),  # diverges in the middle of the first prompt's edge
        trunk[:50] + _tokens(12, seed=5),  # hits the checkpoint the second one left there
        trunk + _tokens(30, seed=3),  # an exact repeat
    ]
    sp = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    want = [_hf_greedy(hf, p, 5) for p in prompts]
    for cache_off in (True, False):
        engine = Engine(
            str(path),
            device="cpu",
            dtype="float32",
            page_size=page_size,
            num_slots=2048,
            swa_num_slots=512,
            chunked_prefill_size=32,
            state_checkpoint_interval=32,
            disable_radix_cache=cache_off,
            max_running_requests=2,
        )
        outs = []
        for p in prompts:  # one at a time, so later prompts hit what earlier ones left
            outs += run_checked(engine, [p], sp)
        assert [o.output_token_ids for o in outs] == want, f"cache_off={cache_off}"
        if not cache_off:
            assert engine.metrics().cached_prompt_tokens_total > 0


def test_mistral_with_blockhash_keeps_the_full_pool_path(
    hf_models: dict[str, tuple[Path, Any]],
) -> None:
    """The block-hash cache has no components: an all-sliding model runs on one FULL pool."""
    path, hf = hf_models["mistral"]
    prompt = _tokens(40, seed=9)
    engine = Engine(
        str(path), device="cpu", dtype="float32", cache="blockhash", num_slots=1024, page_size=4
    )
    assert isinstance(engine.kv.comp, PlainMemory)
    sp = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    outs = run_checked(engine, [prompt, prompt], sp)
    assert [o.output_token_ids for o in outs] == [_hf_greedy(hf, prompt, 4)] * 2

"""The engine over real (tiny, random) Llama-family checkpoints: cache invisibility against
`transformers` greedy decoding, with page sizes 1 and 16 and every cache mode."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from engine_helpers import CACHE_MODES, run_checked

from radixkv.engine.engine import Engine
from radixkv.engine.types import SamplingParams

SP = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)

# Builds checkpoints and runs transformers: a few seconds each (CI still runs them).
pytestmark = pytest.mark.slow


def _workload(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)

    def rand(n: int) -> list[int]:
        return [rng.randrange(3, 40000) for _ in range(n)]

    sys_prompt = rand(40)
    branch = sys_prompt + rand(10)
    return [
        sys_prompt + rand(5),
        branch + rand(7),
        branch + rand(20),
        sys_prompt + rand(1),
        rand(9),
        list(branch),
    ]


def _hf_greedy(path: Path, prompts: list[list[int]], n: int) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    outs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            for _ in range(n):
                nxt = model(ids).logits[0, -1].argmax()
                ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
            outs.append(ids[0, len(p) :].tolist())
    return outs


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_cache_invisible_on_real_tiny_model(arch: str, tiny_model_dir: Callable[..., Path]) -> None:
    from radixkv.model import load_model

    path = tiny_model_dir(arch)
    lm = load_model(str(path), "cpu", torch.float32)
    prompts = _workload()
    expected = _hf_greedy(path, prompts, SP.max_tokens)
    for page_size in (1, 16):
        for kind, disabled in CACHE_MODES:
            eng = Engine(
                lm,
                device="cpu",
                num_slots=1024,
                page_size=page_size,
                cache=kind,
                disable_radix_cache=disabled,
                chunked_prefill_size=32,
            )
            outs = run_checked(eng, prompts, SP)
            assert [o.output_token_ids for o in outs] == expected, (page_size, kind, disabled)
            if not disabled:
                assert eng.metrics().cached_prompt_tokens_total > 0


def test_real_model_retraction_keeps_outputs(tiny_model_dir: Callable[..., Path]) -> None:
    from radixkv.model import load_model

    lm = load_model(str(tiny_model_dir("llama")), "cpu", torch.float32)
    prompts = _workload(seed=1)
    sp = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    roomy = run_checked(Engine(lm, device="cpu", num_slots=2048), prompts, sp)
    eng = Engine(lm, device="cpu", num_slots=160, page_size=16, chunked_prefill_size=32)
    eng.scheduler.decode_reserve_tokens = 0
    tight = run_checked(eng, prompts, sp)
    assert [o.output_token_ids for o in tight] == [o.output_token_ids for o in roomy]
    assert eng.metrics().num_preemptions > 0

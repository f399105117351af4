"""The native C++ layer stack (radixkv.model.nn.native_stack) on Gemma 3 through the engine:
two KV components in one stack, the same bits as the eager layers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from engine_helpers import run_checked

from radixkv.engine.engine import Engine
from radixkv.engine.types import SamplingParams
from radixkv.model import load_model
from radixkv.model.nn.native_stack import NativeStack


def count_native_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = NativeStack.__call__

    def counted(self: NativeStack, *args: object) -> torch.Tensor:
        calls.append(1)
        return real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(NativeStack, "__call__", counted)
    return calls


def tokens(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 1000, (n,), generator=g).tolist()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gemma3_layers_run_natively_with_the_eager_bits(
    dtype: str, tiny_model_dir: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gemma 3's sandwich-norm layers, on two KV components at once (sliding layers on the SWA
    pool with its RoPE base, the full layer on the FULL pool): through the engine, with cache
    hits, chunked prompts longer than the window and batched decodes, the native stack's tokens
    and logprobs equal the eager layers' bit for bit."""
    path = tiny_model_dir("gemma3")
    trunk = tokens(40, seed=11)
    prompts = [trunk + tokens(n, seed=n) for n in (9, 23, 17)] + [tokens(5, seed=3)]
    sp = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=3)
    outs = []
    calls = count_native_calls(monkeypatch)
    for native in (True, False):
        lm = load_model(path, dtype=getattr(torch, dtype))
        stack = lm.model.native_stack()  # type: ignore[attr-defined]
        if stack is None:
            pytest.skip("the native stack needs the C++ kernels")
        assert sorted(stack.kinds) == ["full", "swa"]
        if not native:
            lm.model._native = None  # type: ignore[attr-defined]
        engine = Engine(
            lm,
            dtype=dtype,
            page_size=4,
            num_slots=1024,
            swa_num_slots=256,
            chunked_prefill_size=16,
            max_running_requests=3,
        )
        before = len(calls)
        got = run_checked(engine, prompts[:1], sp) + run_checked(engine, prompts[1:], sp)
        assert (len(calls) > before) == native
        assert engine.metrics().cached_prompt_tokens_total > 0
        outs.append([(o.output_token_ids, o.logprobs) for o in got])
    assert outs[0] == outs[1]

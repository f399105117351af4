"""The decoder stack as one C++ call (radixkv.model.nn.native_stack) against the eager layers: the
same logits, bit for bit, in float32 and bfloat16, for every Llama-family variant it serves
(plain, Q/K/V biases, per-head Q/K norms, sliding windows), through prefill, chunked prefill,
mixed prefill + decode batches and batched decode, with scattered slots. And the cases it must
leave to the eager path."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest
import torch
from test_model_exactness import Req, Slots, step, tokens

from radixkv.memory.pool import KVPool
from radixkv.model import load_model
from radixkv.model.families.llama import CausalLM
from radixkv.model.nn.native_stack import NativeStack


def count_native_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one at every call of the native stack from now on."""
    calls: list[int] = []
    real = NativeStack.__call__

    def counted(self: NativeStack, *args: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(NativeStack, "__call__", counted)
    return calls


def _native_or_skip(lm: object) -> NativeStack:
    stack = lm.model.native_stack()  # type: ignore[attr-defined]
    if stack is None:
        pytest.skip("the native stack needs the C++ kernels (AVX-512; see the warning logged)")
    return stack


def _run(lm: object, seqs: list[list[int]]) -> list[torch.Tensor]:
    """Per-request logits over a prefill, a chunk + decode mix, and two decode steps."""
    pool = KVPool(lm.config.pool_config(256, dtype=lm.dtype))  # type: ignore[attr-defined]
    alloc = Slots(256, seed=7)
    reqs = [Req(s) for s in seqs]
    got = [step(lm, pool, alloc, [(reqs[0], 40), (reqs[1], 3)])]  # type: ignore[arg-type]
    got.append(step(lm, pool, alloc, [(reqs[0], 1), (reqs[1], 30), (reqs[2], 1)]))  # type: ignore[arg-type]
    got.append(step(lm, pool, alloc, [(reqs[0], 1), (reqs[1], 1)]))  # type: ignore[arg-type]
    got.append(step(lm, pool, alloc, [(reqs[2], 1)]))  # type: ignore[arg-type]
    return [t for g in got for t in g]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_native_stack_matches_the_eager_layers_bit_for_bit(
    arch: str,
    dtype: torch.dtype,
    tiny_model_dir: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tiny_model_dir(arch)
    native, eager = load_model(path, dtype=dtype), load_model(path, dtype=dtype)
    _native_or_skip(native)
    eager.model._native = None  # the eager layers
    calls = count_native_calls(monkeypatch)
    # The third request's first step is a one-token prompt: a decode row beside two extends.
    seqs = [tokens(n, seed=30 + n) for n in (42, 34, 2)]
    a = _run(native, seqs)
    assert len(calls) == 4  # every step ran natively
    b = _run(eager, seqs)
    assert len(calls) == 4
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


def test_native_stack_leaves_what_it_cannot_serve_to_the_eager_path(
    tiny_model_dir: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    lm = load_model(tiny_model_dir("llama"))
    _native_or_skip(lm)
    model = cast(CausalLM, lm.model)
    layer = model.decoder_layers[1]
    spec = layer.attn.spec
    # RoPE on part of the head (the stack rotates whole heads only): the eager layers serve it.
    layer.attn.spec = dataclasses.replace(spec, rotary_dim=spec.head_dim // 2)
    assert NativeStack.of(model) is None
    layer.attn.spec = spec
    assert NativeStack.of(model) is not None
    monkeypatch.setenv("RADIXKV_NATIVE_STACK", "0")
    assert NativeStack.of(model) is None

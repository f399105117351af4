"""The compiled model path (torch.compile of the layer stack, radixkv.model.nn.compiled) against
transformers in float32 and against our eager path: prefill, chunked prefill, ragged and mixed
batches, and batched decode, with scattered slots. Compiling takes tens of seconds on a small
CPU, hence `slow`; one compiled model is shared by the whole module."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from test_model_exactness import Req, Slots, assert_close, reference, step, tokens

from radixkv.memory.pool import KVPool
from radixkv.model import load_model

pytestmark = pytest.mark.slow


def count_compiled_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one at every call of a compiled layer stack from now on."""
    from radixkv.model.nn.compiled import CompiledStack

    calls: list[int] = []
    real = CompiledStack.__call__

    def counted(self: CompiledStack, *args: Any) -> torch.Tensor:
        calls.append(1)
        return real(self, *args)

    monkeypatch.setattr(CompiledStack, "__call__", counted)
    return calls


@pytest.fixture(scope="module")
def models(tiny_model_dir: Callable[..., Path]) -> tuple:
    from transformers import AutoModelForCausalLM

    path = tiny_model_dir("qwen3")  # biases off, q/k norm on: the most element-wise code
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    eager = load_model(path)
    compiled = load_model(path)
    compiled.model.compile()
    return compiled, eager, hf


def test_compiled_matches_transformers_and_eager(models: tuple) -> None:
    compiled, eager, hf = models
    seqs = [tokens(n, seed=20 + n) for n in (17, 5, 26)]
    refs = [reference(hf, s) for s in seqs]
    runs = []
    for lm in (compiled, eager):
        pool = KVPool(lm.config.pool_config(128))
        alloc = Slots(128, seed=4)
        reqs = [Req(s) for s in seqs]
        got = [step(lm, pool, alloc, [(reqs[0], 15), (reqs[1], 4), (reqs[2], 20)])]
        got.append(step(lm, pool, alloc, [(reqs[0], 1), (reqs[1], 1), (reqs[2], 4)]))
        got.append(step(lm, pool, alloc, [(reqs[0], 1), (reqs[2], 1)]))  # batched decode
        got.append(step(lm, pool, alloc, [(reqs[2], 1)]))  # single-token graph
        per_req = [
            torch.cat([got[0][0], got[1][0], got[2][0]]),
            torch.cat([got[0][1], got[1][1]]),
            torch.cat([got[0][2], got[1][2], got[2][1], got[3][0]]),
        ]
        runs.append(per_req)
    for ours, ref in zip(runs[0], [refs[0][:17], refs[1], refs[2][:26]], strict=True):
        assert_close(ours, ref)
    for a, b in zip(runs[0], runs[1], strict=True):
        assert torch.equal(a.argmax(-1), b.argmax(-1))
        assert_close(a, b)


def test_compiled_sliding_models_match_transformers_and_their_eager_bits(
    tiny_model_dir: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Models whose layers are standard but whose KV is not FULL-only, over their component
    pools (the standalone Session driver: slots in a seeded random order, SWA slots freed as
    they leave the window): Mistral (every layer on the SWA pool) against transformers, and the
    test-only toy family with sliding and full layers (FULL + SWA in one compiled stack, each
    layer's K/V through `radixkv::attention` into its own component) against its reference.
    Both compiled, both the same bits as their eager forward."""
    from test_hybrid_exactness import reference as hf_reference
    from test_toy_family import SEQS, build, run
    from test_toy_family import reference as toy_reference
    from transformers import AutoModelForCausalLM

    from radixkv.model.registry import ARCHITECTURES, Family

    toy_family = Family("model_toy_family", "ToyConfig", "ToyLM")
    monkeypatch.setitem(ARCHITECTURES, "ToyForCausalLM", toy_family)  # its one registry line
    path = tiny_model_dir("mistral")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    types = ["sliding_attention", "full_attention", "sliding_attention"]
    toy = {"layer_types": types, "sliding_window": 6}
    cases = [
        (load_model(path), load_model(path), [hf_reference(hf, s) for s in SEQS]),
        (
            build("ToyForCausalLM", **toy),
            build("ToyForCausalLM", **toy),
            [toy_reference(s, False, [6, None, 6]) for s in SEQS],
        ),
    ]
    calls = count_compiled_calls(monkeypatch)
    for compiled, eager, refs in cases:
        compiled.model.compile()
        before = len(calls)
        got = run(compiled, SEQS)
        assert len(calls) - before == 4  # every step of `run` ran the compiled stack
        want = run(eager, SEQS)
        assert len(calls) - before == 4
        for ours, ref in zip(got, refs, strict=True):
            assert_close(ours, ref)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)


def test_every_compiled_model_keeps_its_own_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Five models compiled in one process, two graphs each (one token, and the dynamic-shape
    one): more than dynamo's recompile limit (8) allows one code object, so each stack's graphs
    must live apart, and a model's graphs must not be replaced by the next one's."""
    from test_toy_family import SEQS, build, run

    from radixkv.model.registry import ARCHITECTURES, Family

    monkeypatch.setitem(
        ARCHITECTURES, "ToyForCausalLM", Family("model_toy_family", "ToyConfig", "ToyLM")
    )
    models = [build("ToyForCausalLM") for _ in range(5)]
    first = []
    for lm in models:
        lm.model.compile()
        first.append(run(lm, SEQS))
    for lm, want in zip(models, first, strict=True):  # again: each its own graphs, no recompile
        for a, b in zip(run(lm, SEQS), want, strict=True):
            assert torch.equal(a, b)

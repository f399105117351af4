"""The compiled model path (torch.compile of the layer stack, radixkv.model.nn.compiled) against
transformers in float32 and against our eager path: prefill, chunked prefill, ragged and mixed
batches, and batched decode, with scattered slots. Compiling takes tens of seconds on a small
CPU, hence `slow`; one compiled model is shared by the whole module."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_model_exactness import Req, Slots, assert_close, reference, step, tokens

from radixkv.memory.pool import KVPool
from radixkv.model import load_model

pytestmark = pytest.mark.slow


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

"""One answer per question for the hybrid families: a request's logits are the same bits alone or
batched with others (prefilling and decoding beside it), whatever its prompt's chunks and whether
its prefix was computed before (a checkpoint forked, as a cache hit does), in bfloat16 and
float32. Every layer keeps one fixed order per token at any token boundary: attention, the short
convolutions (Gemma 3, LFM2, Qwen3.5's conv: one float32 chain over the taps per element), and
Qwen3.5 / Qwen3-Next's gated DeltaNet (the C++ kernel, `kernels/deltanet.cpp`: token by token in
a prompt, a chunk or a decode step alike).

The models are the seeded tiny checkpoints of tests/conftest.py, over the real projections
(the C++ GEMM) and attention kernels; comparisons are `torch.equal`, row by row."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from radixkv.model import LoadedModel, load_model
from radixkv.model.hybrid_simple import Seq, Session
from radixkv.model.nn.linear import PackedLinear

pytestmark = pytest.mark.slow

ARCHS = ("gemma3", "lfm2", "qwen3_5", "qwen3_next")
# No layer's arithmetic depends on where a chunk starts (for the DeltaNet: with its C++ kernel).
BOUNDARY_FREE = ARCHS
PROMPT, DECODES = 70, 3  # past 64: the old DeltaNet form's block


def _tokens(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 49152, (n,), generator=g).tolist()


def _need_kernels(dtype: torch.dtype) -> None:
    from radixkv.model.kernels import cpu_kernels, gemm

    module = cpu_kernels()
    if gemm(dtype) is None or module is None or not module.extend_attention_supported():
        pytest.skip("the C++ kernels need AVX-512 (bf16: AVX-512 BF16)")


@pytest.fixture(scope="module", params=[torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def models(
    request: pytest.FixtureRequest, tiny_model_dir: Callable[..., Path]
) -> dict[str, LoadedModel]:
    _need_kernels(request.param)
    return {a: load_model(tiny_model_dir(a), "cpu", request.param) for a in ARCHS}


def _run(sess: Session, target: Seq, chunks: list[int], others: list[list[tuple[Seq, int]]]) -> Any:
    """The target's logits [PROMPT + DECODES, vocab]: its prompt in `chunks`, then one token per
    step; step i also runs `others[i]` (if any) in the same forward, before and after it."""
    got = []
    plan = chunks + [1] * DECODES
    for i, n in enumerate(plan):
        extra = others[i] if i < len(others) else []
        work = [*extra[:1], (target, n), *extra[1:]]
        got.append(sess.step(work)[len(extra[:1])])
    return torch.cat(got)


def _equal_rows(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape, what
    bad = [i for i in range(want.shape[0]) if not torch.equal(got[i], want[i])]
    assert not bad, f"{what}: rows {bad} differ (max {float((got - want).abs().max()):.3g})"


def _alone(lm: LoadedModel, seq: list[int], chunks: list[int]) -> torch.Tensor:
    sess = Session(lm, num_slots=512, num_states=8, seed=0)
    return _run(sess, sess.new(seq), chunks, [])


@pytest.mark.parametrize("arch", ARCHS)
def test_every_projection_is_on_the_invariant_gemm(arch: str, models: dict) -> None:
    lm = models[arch]
    lins = [v for m in lm.model.modules() for v in vars(m).values() if isinstance(v, PackedLinear)]
    assert len(lins) >= 2 * lm.config.num_layers + 1  # every layer's, and the head
    assert all(lin.invariant for lin in lins), arch


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_do_not_depend_on_the_batch(arch: str, models: dict) -> None:
    """The target whole then decoding, alone vs beside requests prefilling and decoding."""
    lm = models[arch]
    seq = _tokens(PROMPT + DECODES, seed=1)
    want = _alone(lm, seq, [PROMPT])
    sess = Session(lm, num_slots=512, num_states=8, seed=3)
    a, b, c = (sess.new(_tokens(n, seed=10 + n)) for n in (90, 12, 31))
    others = [
        [(a, 25), (b, 9)],  # prefills before and after it
        [(b, 1), (a, 20)],  # a decode and a prefill chunk beside its first decode
        [(c, 30), (b, 1), (a, 1)],
        [(a, 1), (c, 1), (b, 1)],  # decodes only
    ]
    _equal_rows(_run(sess, sess.new(seq), [PROMPT], others), want, f"{arch} batched")


@pytest.mark.parametrize("arch", BOUNDARY_FREE)
def test_logits_do_not_depend_on_chunks_or_a_cached_prefix(arch: str, models: dict) -> None:
    """Chunkings (fixed and seeded random) beside other requests, and a fork from a checkpoint
    of the prefix (the prefix's K/V shared, its conv and recurrent states copied): the same bits
    as the whole prompt alone."""
    lm = models[arch]
    seq = _tokens(PROMPT + DECODES, seed=2)
    want = _alone(lm, seq, [PROMPT])
    rng = random.Random(arch)
    cuts = sorted(rng.sample(range(1, PROMPT), 4))
    drawn = [b - a for a, b in zip([0, *cuts], [*cuts, PROMPT], strict=True)]
    for chunks in ([7, 13, 50], [1, 1, 68], [69, 1], [16, 16, 38], drawn):
        sess = Session(lm, num_slots=512, num_states=8, seed=len(chunks))
        other = sess.new(_tokens(80, seed=5))
        others = [[(other, 9)], [(other, 1)], [], [(other, 1)]]
        _equal_rows(_run(sess, sess.new(seq), chunks, others), want, f"{arch} {chunks}")
    for prefix in (1, 8, 23, PROMPT - 1):
        sess = Session(lm, num_slots=512, num_states=8, seed=prefix)
        first = sess.new(seq[:prefix])
        sess.step([(first, prefix)])
        fork = sess.fork(sess.checkpoint(first), seq[prefix:])
        got = _run(sess, fork, [PROMPT - prefix], [])
        _equal_rows(got, want[prefix:], f"{arch} prefix {prefix}")

"""The attention backend protocol (radixkv.model.attention.backend) as a contract every backend
keeps: the backend owns the KV write, `capture` + `replay` give the metadata `prepare` gives,
and a new backend (tests/model/naive_attention.py) slots into every family with no model change:
exact against transformers, through prepared (replayed) metadata too."""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from naive_attention import NaiveAttention

from radixkv.memory.hybrid import FULL, SWA, ModelPools
from radixkv.model import load_model
from radixkv.model.attention import (
    AttentionBackend,
    TorchAttention,
    kv_components,
    select_backend,
)
from radixkv.model.batch import ForwardBatch
from radixkv.model.hybrid_simple import Session

Tensor = torch.Tensor

KV, G, D = 2, 3, 16
BACKENDS: dict[str, Callable[[], Any]] = {
    "cpu": lambda: select_backend("cpu"),
    "torch-sdpa": lambda: TorchAttention("sdpa"),
    "naive": NaiveAttention,
}
HAS_TRITON = importlib.util.find_spec("triton") is not None
if HAS_TRITON:  # the CUDA backend, under Triton's interpreter here (tests/conftest.py)
    from radixkv.model.triton.backend import TritonAttention

    BACKENDS["triton"] = TritonAttention


def _batch(lens: list[int], extend: list[int], seed: int) -> ForwardBatch:
    perm = torch.randperm(sum(lens) + 7, generator=torch.Generator().manual_seed(seed))
    ctx, off = [], 0
    for n in lens:
        ctx.append(perm[off : off + n])
        off += n
    return ForwardBatch.from_contexts(torch.zeros(sum(extend), dtype=torch.int64), ctx, extend)


def _inputs(t: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, KV * G, D, generator=g)
    k, v = torch.randn(t, KV, D, generator=g), torch.randn(t, KV, D, generator=g)
    cache = torch.randn(2, 80, KV, D, generator=g)
    return q, k, v, cache


@pytest.mark.parametrize("name", list(BACKENDS))
def test_backend_keeps_the_protocol_and_owns_the_write(name: str) -> None:
    backend = BACKENDS[name]()
    assert isinstance(backend, AttentionBackend)
    batch = _batch([9, 4, 13], [9, 1, 5], seed=1)
    q, k, v, cache = _inputs(batch.num_tokens, seed=2)
    before = cache.clone()
    meta = backend.prepare(batch)
    out = backend.forward(q, k, v, cache[0], cache[1], meta, None, D**-0.5)
    assert out.shape == q.shape
    slots = batch.out_slots
    assert torch.equal(cache[0][slots], k) and torch.equal(cache[1][slots], v)
    untouched = torch.ones(cache.shape[1], dtype=torch.bool)
    untouched[slots] = False
    assert torch.equal(cache[:, untouched], before[:, untouched])
    want = BACKENDS["naive"]().attend(q, cache[0], cache[1], meta_of_naive(batch), None, D**-0.5)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def meta_of_naive(batch: ForwardBatch) -> Any:
    return NaiveAttention().prepare(batch)


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("name", list(BACKENDS))
@pytest.mark.parametrize(
    ("shape_a", "shape_b"),
    [
        (([5, 9, 2], [1, 1, 1]), ([12, 3, 30], [1, 1, 1])),  # decode buckets of 3
        (([8, 6], [3, 1]), ([20, 11], [3, 1])),  # a mixed batch of the same token count
    ],
)
def test_replay_gives_what_prepare_gives(
    name: str, window: int | None, shape_a: tuple, shape_b: tuple
) -> None:
    """Capture on one step, replay another of the same shape: the write and the attention
    through the replayed metadata are the ones `prepare` gives for that step."""
    backend = BACKENDS[name]()
    a, b = _batch(*shape_a, seed=3), _batch(*shape_b, seed=4)
    meta = backend.capture(a, max_context=64)
    backend.replay(meta, b)
    q, k, v, cache = _inputs(b.num_tokens, seed=5)
    cache2 = cache.clone()
    got = backend.forward(q, k, v, cache[0], cache[1], meta, window, D**-0.5)
    want = backend.forward(q, k, v, cache2[0], cache2[1], backend.prepare(b), window, D**-0.5)
    assert torch.equal(cache, cache2)
    if name == "naive":  # its scores span the table's width: 64 columns against 30
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    else:
        assert torch.equal(got, want)


@pytest.mark.parametrize("name", [n for n in ("naive", "triton") if n in BACKENDS])
def test_a_graph_backend_metadata_keeps_its_buffers(name: str) -> None:
    """A graph backend's replay refills the captured buffers in place (a captured graph
    would read them) and refuses a batch of another shape."""
    backend = BACKENDS[name]()
    meta = backend.capture(_batch([5, 9, 2], [1, 1, 1], seed=6), max_context=64)
    fields = [f.name for f in dataclasses.fields(meta)]
    tensors = [f for f in fields if isinstance(getattr(meta, f), Tensor)]
    ptrs = [getattr(meta, f).data_ptr() for f in tensors]
    backend.replay(meta, _batch([40, 3, 7], [1, 1, 1], seed=7))
    assert [getattr(meta, f).data_ptr() for f in tensors] == ptrs
    table = meta.slot_table if name == "naive" else meta.table
    assert table[:, :40].tolist() == _batch([40, 3, 7], [1, 1, 1], seed=7).slot_table.tolist()
    with pytest.raises(ValueError, match="shape"):
        backend.replay(meta, _batch([4, 3], [1, 1], seed=8))


ARCHS = ("llama", "mistral", "gemma3", "qwen3_5")


@pytest.fixture(scope="module")
def refs(tiny_model_dir: Callable[..., Path]) -> dict[str, tuple[Path, Any]]:
    from transformers import AutoModelForCausalLM

    out = {}
    for arch in ARCHS:
        path = tiny_model_dir(arch)
        out[arch] = (path, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval())
    return out


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(3, 49152, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_a_new_backend_slots_in_with_no_model_change(arch: str, refs: dict) -> None:
    """The naive backend under each family (full, all-sliding, sliding + full, state + full):
    chunked prefill past the window and decode match transformers, as the CPU backend does,
    and every KV write went through the backend."""
    path, hf = refs[arch]
    seq = _tokens(30, seed=11)
    with torch.no_grad():
        ref = hf(torch.tensor([seq])).logits[0].float()
    for backend in (NaiveAttention(), select_backend("cpu")):
        lm = load_model(path, attention=backend)
        sess = Session(lm, num_slots=128, num_states=4, seed=0)
        s = sess.new(seq)
        got = [sess.step([(s, n)])[0] for n in (11, 9)]
        got += [sess.step([(s, 1)])[0] for _ in range(10)]
        out = torch.cat(got)
        err = float((out - ref).abs().max() / ref.abs().max())
        assert err < 1e-4, f"{backend.name}: relative error {err:.2e}"
        if isinstance(backend, NaiveAttention):  # one write per attention layer and forward
            assert backend.writes == 12 * sum(k != "state" for k in lm.config.layer_kinds)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("arch", ARCHS)
def test_the_triton_backend_runs_every_family(arch: str, refs: dict) -> None:
    """The CUDA backend (its Triton kernels under the interpreter here) under each family:
    chunked prefill past the window and decode match transformers in float32, and (families
    without state layers) a decode token's logits equal those of the same token computed
    inside a whole-prompt prefill."""
    from radixkv.model.triton.backend import TritonAttention

    path, hf = refs[arch]
    seq = _tokens(30, seed=11)
    with torch.no_grad():
        ref = hf(torch.tensor([seq])).logits[0].float()
    lm = load_model(path, attention=TritonAttention())
    sess = Session(lm, num_slots=128, num_states=4, seed=0)
    s = sess.new(seq)
    got = [sess.step([(s, n)])[0] for n in (11, 9)]
    got += [sess.step([(s, 1)])[0] for _ in range(10)]
    out = torch.cat(got)
    err = float((out - ref).abs().max() / ref.abs().max())
    assert err < 1e-4, f"relative error {err:.2e}"
    if "state" in lm.config.layer_kinds:
        return  # a state layer's chunks are its own order (the engine cuts them at checkpoints)
    whole = Session(lm, num_slots=128, num_states=4, seed=0)
    w = whole.new(seq)
    assert torch.equal(whole.step([(w, 30)])[0][-1], out[-1])


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("name", ["cpu", "naive"] + (["triton"] if HAS_TRITON else []))
def test_models_run_on_prepared_metadata(
    arch: str, name: str, refs: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graph runner's path: metadata captured per KV component on one decode step, replayed
    for the next, handed to the model in `ForwardBatch.attention`; the logits are the ones the
    model gets preparing the step itself."""
    path, _ = refs[arch]
    backend = BACKENDS[name]()
    lm = load_model(path, attention=backend)
    sess = Session(lm, num_slots=128, num_states=4, seed=1)
    seqs = [sess.new(_tokens(n, seed=n)) for n in (14, 9)]
    sess.step([(s, len(s.tokens) - 2) for s in seqs])
    steps = [_decode_batch(sess, seqs)]
    lm.model(steps[0], sess.pools)
    steps.append(_decode_batch(sess, seqs))
    spec = lm.config.pool_spec()
    views = kv_components(steps[0], sess.pools, spec)
    metas = {kind: backend.capture(view, 64) for kind, (_, view) in views.items()}
    for kind, (_, view) in kv_components(steps[1], sess.pools, spec).items():
        backend.replay(metas[kind], view)
    pools_copy = _clone_pools(sess.pools)
    want = lm.model(steps[1], sess.pools)

    def no_prepare(batch: ForwardBatch) -> None:
        raise AssertionError("the model prepared metadata it was handed")

    monkeypatch.setattr(backend, "prepare", no_prepare)
    got = lm.model(dataclasses.replace(steps[1], attention=metas), pools_copy)
    if name == "naive":
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match="KV components"):
        lm.model(dataclasses.replace(steps[1], attention={"other": None}), pools_copy)


def _decode_batch(sess: Session, seqs: list) -> ForwardBatch:
    """One decode step of `seqs` at their next positions (slots taken from the session)."""
    ctx, swa = [], []
    for s in seqs:
        main, win = sess._contexts(s, 1)
        ctx.append(main)
        if win is not None:
            swa.append(win)
    ids = [s.tokens[len(s.full or s.swa) - 1] for s in seqs]
    return ForwardBatch.from_contexts(
        ids, ctx, [1] * len(seqs), kind_slots={SWA: swa} if swa else None
    )


def _clone_pools(pools: Any) -> Any:
    """The same ModelPools with the attention kinds' K/V cloned (other kinds shared)."""
    out = {}
    for kind in pools.kinds:
        pool = pools[kind]
        if kind in (FULL, SWA):
            twin = object.__new__(type(pool))
            twin.__dict__.update(pool.__dict__)
            twin.k = [t.clone() for t in pool.k]
            twin.v = [t.clone() for t in pool.v]
            pool = twin
        out[kind] = pool
    return ModelPools(out)


def test_select_backend_follows_the_device_and_the_override(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CPU takes the torch backend (C++ kernels); RADIXKV_ATTENTION_BACKEND forces one; a
    value that names no backend is refused."""
    monkeypatch.delenv("RADIXKV_ATTENTION_BACKEND", raising=False)
    assert isinstance(select_backend("cpu"), TorchAttention)
    monkeypatch.setenv("RADIXKV_ATTENTION_BACKEND", "torch")
    assert isinstance(select_backend("cpu"), TorchAttention)
    if HAS_TRITON:
        monkeypatch.setenv("RADIXKV_ATTENTION_BACKEND", "triton")
        assert select_backend("cpu").name == "triton"
    monkeypatch.setenv("RADIXKV_ATTENTION_BACKEND", "cudnn")
    with pytest.raises(ValueError, match="triton or torch"):
        select_backend("cpu")

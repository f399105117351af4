"""Our logits vs transformers' full forward (no cache), for every architecture and batch shape.

Slots come from a shuffled slot list handed out by a counter, so context slots are never
contiguous or ordered: the model can only be right if it really reads K/V by slot index.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from radixkv.memory.pool import KVPool
from radixkv.model import LoadedModel, load_model
from radixkv.model.batch import ForwardBatch

ARCHS = ("llama", "qwen2", "qwen3", "mistral")
RTOL = 1e-4


class Slots:
    """A counter over a fixed random permutation of the pool's slots."""

    def __init__(self, num_slots: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.order = torch.randperm(num_slots, generator=g)
        self.next = 0

    def take(self, n: int) -> torch.Tensor:
        out = self.order[self.next : self.next + n]
        assert out.numel() == n, "test pool too small"
        self.next += n
        return out


class Req:
    """One request: its tokens so far and the slot of each position."""

    def __init__(self, tokens: list[int], slots: torch.Tensor | None = None) -> None:
        self.tokens = tokens
        self.slots = slots if slots is not None else torch.empty(0, dtype=torch.int64)


def step(
    lm: LoadedModel, pool: KVPool, alloc: Slots, work: list[tuple[Req, int]]
) -> list[torch.Tensor]:
    """One ForwardBatch extending each (request, n) by its next n tokens; per-request logits."""
    ids, pos, out_slots, ext, seq, ctx = [], [], [], [], [], []
    for req, n in work:
        start = req.slots.numel()
        new = alloc.take(n)
        req.slots = torch.cat([req.slots, new])
        ids += req.tokens[start : start + n]
        pos.append(torch.arange(start, start + n))
        out_slots.append(new)
        ext.append(n)
        seq.append(start + n)
        ctx.append(req.slots.clone())
    batch = ForwardBatch.from_contexts(
        torch.tensor(ids, dtype=torch.int64), ctx, ext, return_all_logits=True
    )
    assert torch.equal(batch.positions, torch.cat(pos))
    assert torch.equal(batch.out_slots, torch.cat(out_slots))
    assert batch.seq_lens == tuple(seq)
    logits = lm.model(batch, pool)
    assert logits.dtype == torch.float32 and logits.shape == (sum(ext), lm.config.vocab_size)
    return list(logits.split(ext))


@pytest.fixture(scope="module")
def setups(tiny_model_dir: Callable[..., Path]) -> dict[str, tuple[LoadedModel, object]]:
    from transformers import AutoModelForCausalLM

    out: dict[str, tuple[LoadedModel, object]] = {}
    for arch in ARCHS:
        path = tiny_model_dir(arch)
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        out[arch] = (load_model(path), hf)
    return out


def reference(hf: object, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()  # type: ignore[operator]


def assert_close(ours: torch.Tensor, ref: torch.Tensor) -> float:
    err = float((ours - ref).abs().max() / ref.abs().max())
    assert err < RTOL, f"relative error {err:.2e}"
    return err


def tokens(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 49152, (n,), generator=g).tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_and_chunked_prefill(arch: str, setups: dict) -> None:
    lm, hf = setups[arch]
    seq = tokens(29, seed=1)
    ref = reference(hf, seq)
    pool = KVPool(lm.config.pool_config(128))
    alloc = Slots(128)
    assert_close(step(lm, pool, alloc, [(Req(seq), 29)])[0], ref)
    req = Req(seq)
    chunks = [step(lm, pool, alloc, [(req, n)])[0] for n in (7, 12, 10)]
    assert_close(torch.cat(chunks), ref)


@pytest.mark.parametrize("arch", ARCHS)
def test_decode_steps(arch: str, setups: dict) -> None:
    lm, hf = setups[arch]
    seq = tokens(24, seed=2)
    ref = reference(hf, seq)
    pool = KVPool(lm.config.pool_config(64))
    alloc = Slots(64, seed=1)
    req = Req(seq)
    got = step(lm, pool, alloc, [(req, 6)])
    got += [step(lm, pool, alloc, [(req, 1)])[0] for _ in range(18)]
    assert_close(torch.cat(got), ref)


@pytest.mark.parametrize("arch", ARCHS)
def test_shared_prefix_with_divergent_suffix(arch: str, setups: dict) -> None:
    lm, hf = setups[arch]
    prefix = tokens(13, seed=3)
    a, b = prefix + tokens(6, seed=4), prefix + tokens(9, seed=5)
    pool = KVPool(lm.config.pool_config(64))
    alloc = Slots(64, seed=2)
    first = Req(a)
    step(lm, pool, alloc, [(first, len(a))])
    # The second request's context starts with the first request's prefix slots (a cache hit).
    second = Req(b, first.slots[: len(prefix)].clone())
    got = step(lm, pool, alloc, [(second, len(b) - len(prefix))])[0]
    assert_close(got, reference(hf, b)[len(prefix) :])
    # Decoding the first request afterwards still sees its own, untouched suffix.
    first.tokens = [*a, 77]
    assert_close(step(lm, pool, alloc, [(first, 1)])[0], reference(hf, first.tokens)[-1:])


@pytest.mark.parametrize("arch", ARCHS)
def test_ragged_and_mixed_batches(arch: str, setups: dict) -> None:
    lm, hf = setups[arch]
    seqs = [tokens(n, seed=10 + n) for n in (17, 5, 26)]
    refs = [reference(hf, s) for s in seqs]
    pool = KVPool(lm.config.pool_config(128))
    alloc = Slots(128, seed=3)
    reqs = [Req(s) for s in seqs]
    # Step 1: ragged prefill of three different lengths (the third only partly: chunked).
    got = step(lm, pool, alloc, [(reqs[0], 15), (reqs[1], 4), (reqs[2], 20)])
    # Step 2: mixed — two decodes with different context lengths and one prefill chunk.
    got2 = step(lm, pool, alloc, [(reqs[0], 1), (reqs[1], 1), (reqs[2], 4)])
    # Step 3: pure batched decode, contexts 17, 6 → 5 is done, and 25.
    got3 = step(lm, pool, alloc, [(reqs[0], 1), (reqs[2], 1)])
    assert_close(torch.cat([got[0], got2[0], got3[0]]), refs[0][:17])
    assert_close(torch.cat([got[1], got2[1]]), refs[1])
    assert_close(torch.cat([got[2], got2[2], got3[1]]), refs[2][:25])


def test_last_token_logits_by_default(setups: dict) -> None:
    lm, hf = setups["llama"]
    seqs = [tokens(n, seed=n) for n in (9, 4)]
    pool = KVPool(lm.config.pool_config(32))
    slots = torch.randperm(32)
    batch = ForwardBatch.from_contexts(
        torch.tensor(seqs[0] + seqs[1]), [slots[:9], slots[9:13]], [9, 4]
    )
    logits = lm.model(batch, pool)
    assert logits.shape == (2, lm.config.vocab_size)
    assert_close(logits[0], reference(hf, seqs[0])[-1])
    assert_close(logits[1], reference(hf, seqs[1])[-1])


def test_mistral_window_is_applied(setups: dict, tiny_model_dir: Callable[..., Path]) -> None:
    """Past the window, the windowed model must differ from the same weights without a window."""
    lm, _ = setups["mistral"]
    assert lm.config.sliding_window == 8 and lm.config.layer_windows == (8, 8)
    seq = tokens(20, seed=7)
    pool = KVPool(lm.config.pool_config(32))
    windowed = step(lm, pool, Slots(32), [(Req(seq), 20)])[0]
    plain = load_model(tiny_model_dir("mistral", sliding_window=None))
    full = step(plain, pool, Slots(32), [(Req(seq), 20)])[0]
    assert torch.allclose(windowed[:8], full[:8], rtol=1e-5, atol=1e-5)
    assert (windowed[9:] - full[9:]).abs().max() > 1e-2

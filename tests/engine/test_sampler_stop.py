from __future__ import annotations

import torch

from radixkv.engine.sampling.sampler import (
    argmax_rows,
    make_generator,
    rows_of,
    sample,
    sample_one,
)
from radixkv.engine.sampling.stop import TextStream
from radixkv.engine.types import SamplingParams


def test_top_k_and_top_p_restrict_the_support() -> None:
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0, -1.0])
    gen = make_generator(0)
    k2 = SamplingParams(temperature=5.0, top_k=2)
    assert {sample_one(logits, k2, gen) for _ in range(300)} == {0, 1}
    # softmax: p0 ≈ 0.64, p1 ≈ 0.23: the nucleus of 0.8 is {0, 1}; of 0.5 is {0}.
    p8 = SamplingParams(temperature=1.0, top_p=0.8)
    assert {sample_one(logits, p8, gen) for _ in range(300)} == {0, 1}
    p5 = SamplingParams(temperature=1.0, top_p=0.5)
    assert {sample_one(logits, p5, gen) for _ in range(50)} == {0}
    hot = SamplingParams(temperature=50.0)
    assert len({sample_one(logits, hot, gen) for _ in range(400)}) == 6


def test_batch_sample_mixes_greedy_and_seeded_rows() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0), SamplingParams(seed=5), SamplingParams(top_k=1)]
    a = sample(logits, params, [None, make_generator(5), None])
    b = sample(logits, params, [None, make_generator(5), None])
    assert a == b
    assert a[0] == int(logits[0].argmax()) and a[2] == int(logits[2].argmax())


class _Chars:
    def __init__(self, pieces: dict[int, str]) -> None:
        self.pieces = pieces

    def push(self, token_id: int) -> str:
        return self.pieces[token_id]

    def flush(self) -> str:
        return ""


def test_text_stream_stop_across_token_boundaries() -> None:
    pieces = {0: "he", 1: "llo ", 2: "wo", 3: "rld", 4: "!"}
    ts = TextStream(_Chars(pieces), stop=("o w", "xyz"))
    assert not ts.push(0) and ts.take(False) == "he"
    assert not ts.push(1)
    assert ts.take(False) == "ll"  # "o " could start "o w": held back
    assert ts.push(2) and ts.stopped
    assert ts.text == "hell" and ts.take(True) == ""


def test_text_stream_hold_back_released_when_no_match() -> None:
    ts = TextStream(_Chars({0: "ab", 1: "c", 2: "d"}), stop=("bce",))
    ts.push(0)
    assert ts.take(False) == "a"  # "b" may start "bce"
    ts.push(1)
    assert ts.take(False) == ""  # "bc" still may
    ts.push(2)
    assert ts.take(False) == "bcd"
    assert ts.take(True) == "" and ts.text == "abcd"


def test_sampled_frequencies_match_the_softmax() -> None:
    """The inverse-CDF draw samples the tempered softmax (batched path: temperature only), and
    never a token of zero probability (top-k path)."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -30.0])
    params = [SamplingParams(temperature=0.7, seed=s) for s in range(4)]
    gens = [make_generator(s) for s in range(4)]
    counts = torch.zeros(6)
    draws = 5000
    for _ in range(draws):
        for tok in sample(logits.expand(4, 6), params, gens):
            counts[tok] += 1
    expected = torch.softmax(logits / 0.7, dim=-1)
    assert torch.allclose(counts / counts.sum(), expected, atol=0.01), counts / counts.sum()
    k3 = [SamplingParams(temperature=3.0, top_k=3)] * 2
    seen = {t for _ in range(500) for t in sample(logits.expand(2, 6), k3, [gens[0], gens[1]])}
    assert seen == {0, 1, 2}


def test_batched_and_single_row_draws_agree() -> None:
    """A row draws the same token alone or in a batch (one uniform from its own generator)."""
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(3))
    params = [SamplingParams(temperature=1.0 + i / 4, seed=i) for i in range(5)]
    batched = sample(logits, params, [make_generator(i) for i in range(5)])
    single = [sample_one(logits[i], params[i], make_generator(i)) for i in range(5)]
    assert batched == single


def test_greedy_rows_take_the_first_maximum_as_torch_does() -> None:
    """The numpy argmax the CPU path uses against torch.argmax: ties (the first index wins),
    rows of one value, -inf masks, a non-contiguous view, and the greedy path end to end."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5000, generator=gen)
    x[1, 17] = x[1, 4000] = 50.0  # a tie: 17
    x[2] = 1.0  # all equal: 0
    x[3, :4000] = float("-inf")
    x[4] = torch.round(x[4])  # many ties
    for view in (x, x[:, ::2], x.t().contiguous().t()):
        assert argmax_rows(view) == torch.argmax(view, dim=-1).tolist()
    greedy = SamplingParams(temperature=0.0)
    assert sample(x, [greedy] * 6, [None] * 6) == torch.argmax(x, dim=-1).tolist()
    assert sample_one(x[1], greedy, None) == 17


def test_rows_of_copies_only_a_subset() -> None:
    x = torch.arange(12.0).reshape(4, 3)
    assert rows_of(x, [0, 1, 2, 3]) is x  # every row in order: the tensor itself
    assert torch.equal(rows_of(x, [1, 3]), x[[1, 3]])
    assert torch.equal(rows_of(x, [3, 2, 1, 0]), x.flip(0))  # all rows, another order
    assert torch.equal(rows_of(x, [0, 1, 2]), x[:3])

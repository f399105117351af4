"""The gated DeltaNet C++ kernel (`kernels/deltanet.cpp`, `gated_delta_rule`).

Against references (tolerance): a float64 token-by-token recurrence and the chunked torch form,
over random shapes (dk / dv 64 and 128 and ragged ones, grouped key heads, 1-200 tokens).
Bit for bit (`torch.equal`): a run of t tokens gives the same outputs and final state as the same
tokens split at random boundaries with the state carried, as token-by-token decode calls beside
other sequences, and as one call mixing runs and decode rows; at 1 and 2 threads alike.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from radixkv.model.families.deltanet import chunked, prepare_qk


@pytest.fixture(scope="module")
def kern() -> Any:
    from radixkv.model.kernels import deltanet

    module = deltanet()
    if module is None:
        pytest.skip("the C++ kernels are not built on this machine")
    return module


Case = dict[str, torch.Tensor]


def _case(t: int, hk: int, hv: int, dk: int, dv: int, dtype: torch.dtype, seed: int) -> Case:
    """Raw q, k [t, hk, dk], v [t, hv, dv] in `dtype` (token-strided views of one row, as the
    model's conv output is), g, beta [t, hv] float32, and a non-zero start state [hv, dk, dv]."""
    gen = torch.Generator().manual_seed(seed)
    row = torch.randn(t, 2 * hk * dk + hv * dv, generator=gen).to(dtype)
    q, k, v = row.split([hk * dk, hk * dk, hv * dv], dim=-1)
    return {
        "q": q.reshape(t, hk, dk),
        "k": k.reshape(t, hk, dk),
        "v": v.reshape(t, hv, dv),
        "g": -torch.rand(t, hv, generator=gen) * 2 - 0.01,
        "beta": torch.rand(t, hv, generator=gen),
        "s0": torch.randn(hv, dk, dv, generator=gen) * 0.3,
    }


def _call(
    kern: Any, c: Case, state: torch.Tensor, runs: list[tuple[int, int, int, bool]]
) -> torch.Tensor:
    """gated_delta_rule over `runs` ((start, length, slot, fresh) each) of case c's tokens."""
    st, ln, sl, fr = (torch.tensor(col, dtype=torch.int64) for col in zip(*runs, strict=True))
    scale = c["q"].shape[-1] ** -0.5
    return kern.gated_delta_rule(
        c["q"], c["k"], c["v"], c["g"], c["beta"], state, st, ln, sl, fr, scale
    )


def _tokens(c: Case, a: int, b: int) -> Case:
    return {n: (x if n == "s0" else x[a:b]) for n, x in c.items()}


def _reference64(c: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence in float64, token by token, from the case's start state."""
    hv, dk = c["v"].shape[1], c["q"].shape[2]
    rep = hv // c["q"].shape[1]
    q, k = (x.double().repeat_interleave(rep, dim=1) for x in (c["q"], c["k"]))
    q, k = (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    q = q * dk**-0.5
    v, g, beta = c["v"].double(), c["g"].double(), c["beta"].double()
    s = c["s0"].double().clone()
    outs = []
    for t in range(q.shape[0]):
        s = s * g[t].exp()[:, None, None]
        u = (v[t] - torch.einsum("hkv,hk->hv", s, k[t])) * beta[t][:, None]
        s = s + k[t][:, :, None] * u[:, None, :]
        outs.append(torch.einsum("hkv,hk->hv", s, q[t]))
    return torch.stack(outs), s


SHAPES = [  # (t, hk, hv, dk, dv)
    (1, 2, 4, 64, 64),
    (37, 2, 4, 128, 128),
    (200, 1, 2, 128, 64),
    (70, 4, 4, 64, 128),
    (23, 2, 6, 20, 24),  # ragged dims: masked lanes
    (9, 3, 3, 16, 16),
]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"t{s[0]}-hv{s[2]}-{s[3]}x{s[4]}" for s in SHAPES])
def test_kernel_matches_float64_and_chunked_references(kern: Any, shape: tuple) -> None:
    t, hk, hv, dk, dv = shape
    c = _case(t, hk, hv, dk, dv, torch.float32, seed=t + dk)
    state = c["s0"][None].clone()
    got = _call(kern, c, state, [(0, t, 0, False)])
    want, want_s = _reference64(c)
    torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(state[0].double(), want_s, atol=2e-6, rtol=1e-5)
    q, k = prepare_qk(c["q"], c["k"], hv)
    ch, ch_s = chunked(q, k, c["v"], c["g"], c["beta"], c["s0"])
    torch.testing.assert_close(got, ch, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(state[0], ch_s, atol=2e-6, rtol=1e-5)


def test_fresh_runs_start_from_zeros_whatever_the_slot_holds(kern: Any) -> None:
    c = _case(19, 2, 4, 32, 32, torch.float32, seed=3)
    c["s0"] = torch.zeros_like(c["s0"])
    want, want_s = _reference64(c)
    state = torch.full((3, 4, 32, 32), 7.0)
    got = _call(kern, c, state, [(0, 19, 2, True)])
    torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(state[2].double(), want_s, atol=2e-6, rtol=1e-5)
    assert torch.equal(state[:2], torch.full((2, 4, 32, 32), 7.0))  # other slots untouched


def _whole(kern: Any, c: Case) -> tuple[torch.Tensor, torch.Tensor]:
    state = c["s0"][None].clone()
    return _call(kern, c, state, [(0, c["q"].shape[0], 0, False)]), state[0]


DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("dims", [(128, 128), (20, 24)], ids=["128", "ragged"])
def test_any_split_of_a_run_gives_the_same_bits(kern: Any, dtype: torch.dtype, dims: tuple) -> None:
    """Random chunkings, the state carried between calls (a chunked prefill, or a fork from a
    checkpoint), equal the whole run bit for bit."""
    t = 90
    c = _case(t, 2, 4, *dims, dtype, seed=11)
    want, want_s = _whole(kern, c)
    rng = random.Random(5)
    for _ in range(4):
        cuts = sorted(rng.sample(range(1, t), rng.randint(1, 6)))
        state = c["s0"][None].clone()
        parts = []
        for a, b in zip([0, *cuts], [*cuts, t], strict=True):
            parts.append(_call(kern, _tokens(c, a, b), state, [(0, b - a, 0, False)]))
        assert torch.equal(torch.cat(parts), want), cuts
        assert torch.equal(state[0], want_s), cuts


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_decode_steps_beside_other_sequences_give_the_same_bits(
    kern: Any, dtype: torch.dtype
) -> None:
    """Three sequences decoded one token per call (each a one-token run in a batch of three,
    in a different slot and row order each step), and one call mixing a run of one with decode
    rows of the others: every token's output and every final state equal each sequence's
    whole run."""
    t, seqs = 24, 3
    cases = [_case(t, 2, 4, 64, 128, dtype, seed=20 + i) for i in range(seqs)]
    wants = [_whole(kern, c) for c in cases]
    state = torch.stack([c["s0"] for c in cases])
    got: list[list[torch.Tensor]] = [[] for _ in cases]
    for step in range(t):
        order = [(step + i) % seqs for i in range(seqs)]  # rows rotate
        batch = {n: torch.stack([cases[i][n][step] for i in order]) for n in ("q", "k", "v")}
        batch |= {n: torch.stack([cases[i][n][step] for i in order]) for n in ("g", "beta")}
        runs = [(row, 1, i, False) for row, i in enumerate(order)]
        out = _call(kern, batch, state, runs)
        for row, i in enumerate(order):
            got[i].append(out[row])
    for i, (want, want_s) in enumerate(wants):
        assert torch.equal(torch.stack(got[i]), want), f"sequence {i}"
        assert torch.equal(state[i], want_s), f"sequence {i} state"
    # One call: sequence 0's tokens 5..17 as a run, sequences 1 and 2's token 5 as decode rows,
    # after each had run its first 5 tokens alone.
    state = torch.stack([c["s0"] for c in cases])
    for i, c in enumerate(cases):
        _call(kern, _tokens(c, 0, 5), state[i : i + 1], [(0, 5, 0, False)])
    parts = [_tokens(cases[0], 5, 18), _tokens(cases[1], 5, 6), _tokens(cases[2], 5, 6)]
    mixed = {n: torch.cat([p[n] for p in parts]) for n in ("q", "k", "v", "g", "beta")}
    out = _call(kern, mixed, state, [(0, 13, 0, False), (13, 1, 1, False), (14, 1, 2, False)])
    assert torch.equal(out[:13], wants[0][0][5:18])
    assert torch.equal(out[13], wants[1][0][5]) and torch.equal(out[14], wants[2][0][5])


def test_thread_count_does_not_change_a_bit(kern: Any) -> None:
    c = _case(60, 2, 8, 128, 128, torch.bfloat16, seed=9)
    before = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            results.append(_whole(kern, c))
    finally:
        torch.set_num_threads(before)
    for out, s in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(s, results[0][1])


def test_bad_arguments_are_refused(kern: Any) -> None:
    c = _case(4, 2, 4, 16, 16, torch.float32, seed=1)
    state = torch.zeros(2, 4, 16, 16)
    with pytest.raises(RuntimeError, match="share state slot"):
        _call(kern, c, state, [(0, 2, 1, False), (2, 2, 1, False)])
    with pytest.raises(RuntimeError, match="outside the tokens"):
        _call(kern, c, state, [(2, 3, 0, False)])
    with pytest.raises(RuntimeError, match="out of range"):
        _call(kern, c, state, [(0, 4, 2, False)])
    with pytest.raises(RuntimeError, match="state must be"):
        _call(kern, c, torch.zeros(2, 4, 16, 8), [(0, 4, 0, False)])

"""Batched state-layer prefill: the convolutions of several prompts / chunks in one forward
(`state_layers.conv_runs`) give the same bits as one request at a time, in float32 and
bfloat16, for fresh and continued states, and update every request's conv state the same way."""

from __future__ import annotations

import pytest
import torch

from radixkv.model.families.state_layers import StateRun, conv_extend, conv_runs, read_state


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lens", [(5, 2, 17), (3, 40), (9, 9, 9, 2)])
def test_batched_conv_equals_one_run_at_a_time(dtype: torch.dtype, lens: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(sum(lens))
    channels, k = 12, 4
    x = torch.randn(sum(lens), channels, generator=g).to(dtype)
    weight = torch.randn(channels, k, generator=g).to(dtype)
    bias = torch.randn(channels, generator=g).to(dtype)
    state0 = torch.randn(8, channels, k - 1, generator=g).to(dtype)
    runs, start = [], 0
    for i, n in enumerate(lens):
        runs.append(StateRun(start, start + n, slot=2 * i + 1, fresh=i % 2 == 0))
        start += n
    want_state = state0.clone()
    want = torch.empty_like(x)
    for run in runs:  # the one-at-a-time path
        y, new = conv_extend(x[run.start : run.end], read_state(want_state, run), weight, bias)
        want[run.start : run.end] = y
        want_state[run.slot] = new
    got_state = state0.clone()
    got = torch.empty_like(x)
    conv_runs(x, got_state, runs, weight, bias, got)
    assert torch.equal(got, want)
    assert torch.equal(got_state, want_state)
    assert not torch.equal(got_state, state0)  # the states moved

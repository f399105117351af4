"""`ForwardBatch.kind_slots`: the slots of the kinds besides FULL, keyed by kind. A windowed
kind's out slots follow from its table exactly as FULL's do, a state kind keeps one slot per
request, the accessors check the kind's shape, and `to` moves every kind's tensors."""

from __future__ import annotations

import pytest
import torch

from radixkv.memory.hybrid import STATE, SWA
from radixkv.model.batch import ForwardBatch, StateSlots, WindowSlots


def batch() -> ForwardBatch:
    full = [torch.arange(10, 15), torch.arange(20, 23)]
    swa = [torch.tensor([-1, -1, 3, 4, 5]), torch.tensor([7, 8, 9])]
    return ForwardBatch.from_contexts(
        list(range(4)), full, [2, 2], kind_slots={SWA: swa, STATE: [6, 1]}
    )


def test_windowed_kind_reads_its_table_like_full() -> None:
    b = batch()
    own = b.window(SWA)
    assert isinstance(own, WindowSlots)
    assert own.slot_table.shape == b.slot_table.shape
    assert b.out_slots.tolist() == [13, 14, 21, 22]
    assert own.out_slots.tolist() == [4, 5, 8, 9]  # positions 3, 4 and 1, 2 of each table row
    ctx = b.window_context_slots(SWA)
    assert ctx is not None and [c.tolist() for c in ctx] == [[-1, -1, 3, 4, 5], [7, 8, 9]]


def test_state_kind_and_the_accessors() -> None:
    b = batch()
    assert b.states(STATE) == (6, 1)
    assert b.kind_slots[STATE] == StateSlots((6, 1))
    assert b.window("mla") is None and b.states("mla") is None
    with pytest.raises(TypeError):
        b.window(STATE)
    with pytest.raises(TypeError):
        b.states(SWA)
    plain = ForwardBatch.from_contexts([1], [torch.arange(3)], [1])
    assert dict(plain.kind_slots) == {} and plain.window(SWA) is None


def test_to_moves_every_kind() -> None:
    b = batch()
    moved = b.to("meta")
    own = moved.window(SWA)
    assert own is not None and own.slot_table.device.type == "meta"
    assert own.out_slots.device.type == "meta" and moved.states(STATE) == (6, 1)

"""The STATE pool: a fixed-size recurrent state per sequence (gated DeltaNet recurrent + conv
state, LFM2 short-conv state), one slot holding every state layer of one sequence at one boundary
(`StatePool`), described by each state layer's named tensors (`StateLayerSpec`). Working states of
running requests and cached checkpoints are slots of the same pool; copy-on-write copies whole
slots. A tensor owner only: which slot belongs to whom is the allocator's and the tree's business.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def _elem(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class StateTensorSpec:
    """One named per-slot tensor of a state layer, e.g. ("conv", (C, K-1)).

    `dtype` None means the model dtype; recurrent states pin float32 (they accumulate)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype | None = None

    def resolve(self, model_dtype: torch.dtype) -> torch.dtype:
        return model_dtype if self.dtype is None else self.dtype


@dataclass(frozen=True)
class StateLayerSpec:
    """The state tensors of one STATE layer (order = the model's state layers in order)."""

    tensors: tuple[StateTensorSpec, ...]


@dataclass(frozen=True)
class StatePoolConfig:
    layers: tuple[StateLayerSpec, ...]
    num_slots: int
    dtype: torch.dtype = torch.float32  # the model dtype (tensors with dtype None use it)
    device: str = "cpu"

    @property
    def bytes_per_slot(self) -> int:
        total = 0
        for layer in self.layers:
            for t in layer.tensors:
                n = 1
                for d in t.shape:
                    n *= d
                total += n * _elem(t.resolve(self.dtype))
        return total

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_slot * self.num_slots


class StatePool:
    """`tensors[j][name]`: [num_slots, *shape] for the j-th state layer.

    Slot contents are opaque to the pool. Invariant kept by callers: a slot is either free, a
    running request's working state (written by the model in place), or a checkpoint (never written
    again until freed)."""

    def __init__(self, config: StatePoolConfig) -> None:
        self.config = config
        self.tensors: list[dict[str, torch.Tensor]] = [
            {
                t.name: torch.zeros(
                    (config.num_slots, *t.shape),
                    dtype=t.resolve(config.dtype),
                    device=config.device,
                )
                for t in layer.tensors
            }
            for layer in config.layers
        ]

    @property
    def num_slots(self) -> int:
        return self.config.num_slots

    @property
    def num_layers(self) -> int:
        return len(self.tensors)

    def copy_state(self, src: int, dst: int) -> None:
        """Slot `dst` becomes an exact copy of slot `src` (every layer, every tensor)."""
        if src == dst:
            return
        for layer in self.tensors:
            for t in layer.values():
                t[dst].copy_(t[src])

    def copy_states(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Batched `copy_state`: dst[i] <- src[i]; `dst` must not repeat nor overlap `src`."""
        src = src.to(self.config.device)
        dst = dst.to(self.config.device)
        for layer in self.tensors:
            for t in layer.values():
                t.index_copy_(0, dst, t.index_select(0, src))

    def clear(self, slots: torch.Tensor) -> None:
        """Zero the given slots (the state before any token)."""
        slots = slots.to(self.config.device)
        for layer in self.tensors:
            for t in layer.values():
                t.index_fill_(0, slots, 0)

"""The attention backend protocol: the seam between the model and whatever computes attention.

A model never touches the KV pool itself. Per step and per KV component (FULL, SWA) it asks the
backend for metadata once (`prepare`), then each attention layer hands the backend its new
tokens' q, k, v and that layer's pool tensors (`forward`): the backend stores k/v at this
step's slots (`write_kv`) and attends q to every request's context, read from the pool through
the batch's slot table (`attend`). Everything a backend needs is in the ForwardBatch as tensors
(slot table, sequence / prefix / extend lengths, query starts, out slots) plus their host
mirror, so a device backend reads them in its kernels and does its host work in `prepare`, once.

CUDA graphs go behind `capture` / `replay`: a graph runner (radixkv's engine, per decode
batch-size bucket) calls `capture(batch, max_context)` once on a batch of the bucket's shape and
captures the model's forward with that metadata (passed in `ForwardBatch.attention`); before
each replay it calls `replay(meta, batch)` with the step's batch (padded to the bucket), which
copies the step's tensors into the metadata's buffers, outside the graph. So the metadata a
captured graph reads must live in buffers it owns, sized for `max_context`, whose addresses
never change, and `attend` / `write_kv` must read only them (no host values that vary between
steps). A backend that cannot be captured says `supports_graphs = False` and implements both
eagerly: `capture` = `prepare`, `replay` = prepare again in place; the contract (after
`replay(meta, b)`, `forward` through `meta` equals `forward` through `prepare(b)`, bit for bit)
is tested for every backend in tests/model/test_attention_backend.py.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from radixkv.model.batch import ForwardBatch


@runtime_checkable
class AttentionBackend(Protocol):
    """What the model needs from an attention implementation. Metadata is the backend's own
    type: the model only hands it back."""

    name: str
    supports_graphs: bool  # capture/replay keep addresses fixed (a captured graph can run)

    def prepare(self, batch: ForwardBatch) -> Any:
        """Once per step and KV component: everything the layers' calls will read, host work
        included (`batch` is the component's view: its slot table and out slots)."""
        ...

    def write_kv(
        self,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: Any,
    ) -> None:
        """Store this step's k/v [T, KV, D] of one layer at the step's out slots of that layer's
        pool tensors k_cache/v_cache [slots, KV, D] (cast to the pool's dtype)."""
        ...

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: Any,
        window: int | None,
        scale: float,
    ) -> torch.Tensor:
        """q [T, H, D] → output [T, H, D]: token i of request r attends to its context
        positions <= its own (and > its position - window), read from the pool by slot."""
        ...

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: Any,
        window: int | None,
        scale: float,
    ) -> torch.Tensor:
        """What an attention layer calls: `write_kv` then `attend` (a backend may fuse them).
        Invariant: this step's K/V are in the pool before attention reads the context."""
        ...

    def capture(self, batch: ForwardBatch, max_context: int) -> Any:
        """Metadata for a forward to be captured and replayed: like `prepare(batch)`, over
        buffers the metadata owns, sized for contexts up to `max_context` slots."""
        ...

    def replay(self, meta: Any, batch: ForwardBatch) -> None:
        """Refill `meta` (from `capture`) for the step `batch` of the same shape (requests,
        tokens), in place, outside any graph."""
        ...


def write_slots(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """The plain KV write: k/v rows at `slots` of one layer's pool tensors, in the pool's dtype
    (what `KVPool.write` does, for one layer)."""
    k_cache.index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.index_copy_(0, slots, v.to(v_cache.dtype))

"""A test-only attention backend: plain softmax attention over the whole slot table, built to
show that a backend slots in behind `radixkv.model.attention.AttentionBackend` with no model
change, and to hold the capture / replay contract as a graph backend would keep it.

Its `attend` reads only tensors of its metadata (no host value that changes between steps), and
`capture` puts the metadata in buffers it owns, sized for `max_context`, that `replay` refills
in place: the shape a CUDA-graph backend's metadata has (a captured graph would read those
buffers). Every token's scores span the whole table width, masked by position, in float64."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixkv.model.attention import write_slots
from radixkv.model.batch import ForwardBatch


@dataclass
class NaiveMeta:
    out_slots: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    token_req: torch.Tensor  # [T] the request of each token
    slot_table: torch.Tensor  # [R, C]


class NaiveAttention:
    name = "naive"
    supports_graphs = True

    def __init__(self) -> None:
        self.writes = 0  # KV writes made (a model that wrote the pool itself would leave it 0)

    def prepare(self, batch: ForwardBatch) -> NaiveMeta:
        req = torch.repeat_interleave(
            torch.arange(batch.num_requests, device=batch.q_start.device), batch.extend_lens_t
        )
        return NaiveMeta(batch.out_slots, batch.positions, req, batch.slot_table)

    def capture(self, batch: ForwardBatch, max_context: int) -> NaiveMeta:
        t, r = batch.num_tokens, batch.num_requests
        dev = batch.slot_table.device
        meta = NaiveMeta(
            out_slots=torch.zeros(t, dtype=torch.int64, device=dev),
            positions=torch.zeros(t, dtype=torch.int64, device=dev),
            token_req=torch.zeros(t, dtype=torch.int64, device=dev),
            slot_table=torch.zeros((r, max_context), dtype=torch.int64, device=dev),
        )
        self.replay(meta, batch)
        return meta

    def replay(self, meta: NaiveMeta, batch: ForwardBatch) -> None:
        fresh = self.prepare(batch)
        width = batch.slot_table.shape[1]
        if meta.out_slots.shape != fresh.out_slots.shape or width > meta.slot_table.shape[1]:
            raise ValueError("replay needs a batch of the captured shape")
        meta.out_slots.copy_(fresh.out_slots)
        meta.positions.copy_(fresh.positions)
        meta.token_req.copy_(fresh.token_req)
        meta.slot_table.zero_()
        meta.slot_table[:, :width].copy_(fresh.slot_table)

    def write_kv(
        self,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: NaiveMeta,
    ) -> None:
        self.writes += 1
        write_slots(k_cache, v_cache, k, v, meta.out_slots)

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: NaiveMeta,
        window: int | None,
        scale: float,
    ) -> torch.Tensor:
        t, h, d = q.shape
        kv = k_cache.shape[1]
        slots = meta.slot_table.index_select(0, meta.token_req)  # [T, C]
        cols = torch.arange(slots.shape[1], device=slots.device)
        pos = meta.positions[:, None]
        seen = cols[None, :] <= pos
        if window is not None:
            seen &= cols[None, :] > pos - window
        keys = k_cache[slots].double()  # [T, C, KV, D]
        values = v_cache[slots].double()
        qg = q.double().view(t, kv, h // kv, d)
        scores = torch.einsum("tkgd,tckd->tkgc", qg, keys) * scale
        scores = scores.masked_fill(~seen[:, None, None, :], float("-inf"))
        out = torch.einsum("tkgc,tckd->tkgd", scores.softmax(-1), values)
        return out.reshape(t, h, d).to(q.dtype)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: NaiveMeta,
        window: int | None,
        scale: float,
    ) -> torch.Tensor:
        self.write_kv(k_cache, v_cache, k, v, meta)
        return self.attend(q, k_cache, v_cache, meta, window, scale)

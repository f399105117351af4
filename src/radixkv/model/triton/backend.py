"""`TritonAttention`: the Triton kernels (paged_attention.py) behind the model's attention seam
(radixkv.model.attention.backend), so a CUDA device runs a model with no model change.

Per step and KV component `prepare` takes the batch's tensors as they are (its slot table,
sequence lengths, query starts, out slots): no host work beyond reading the longest context,
which only sets how many parallel parts a decode splits its keys over (the bits never depend on
it). `forward` writes the layer's new K/V at the out slots (`write_slots`, the pool's dtype), then
attends: one ragged extend launch for a step with any prefill, the split-K decode launch for a
step of one token per request.

Graphs: `capture(batch, max_context)` puts the metadata in buffers it owns (a slot table
`max_context` wide, lengths, query starts, out slots) with the part count fixed by `max_context`,
and `replay` refills them in place, outside the graph; the kernels read only those buffers, so a
decode captured once per batch-size bucket replays with the step's tables (issue 35's CUDA-graph
runner goes on top). On CPU the same class runs under Triton's interpreter (TRITON_INTERPRET=1,
set before triton is imported): how the tests here run it, and `RADIXKV_ATTENTION_BACKEND=triton`
selects it in `select_backend`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixkv.model.attention.backend import write_slots
from radixkv.model.batch import ForwardBatch


@dataclass
class TritonMeta:
    """What the kernels read for one step and KV component (all tensors on the device)."""

    out_slots: torch.Tensor  # [T] this step's K/V slots
    table: torch.Tensor  # [R, W] slot of position i of request r (W >= every seq len)
    seq_lens: torch.Tensor  # [R] context length after this step
    q_start: torch.Tensor  # [R + 1] request r's rows of q are [q_start[r], q_start[r + 1])
    decode: bool  # one new token per request: the split-K launch
    max_seq_len: int  # sets a decode's part count only


class TritonAttention:
    """The attention backend of CUDA devices (and of CPU under Triton's interpreter)."""

    name = "triton"
    supports_graphs = True

    def prepare(self, batch: ForwardBatch) -> TritonMeta:
        return TritonMeta(
            out_slots=batch.out_slots,
            table=batch.slot_table,
            seq_lens=batch.seq_lens_t,
            q_start=batch.q_start,
            decode=batch.is_decode,
            max_seq_len=max(batch.seq_lens, default=1),
        )

    def write_kv(
        self,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: TritonMeta,
    ) -> None:
        write_slots(k_cache, v_cache, k, v, meta.out_slots)

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: TritonMeta,
        window: int | None,
        scale: float,
    ) -> torch.Tensor:
        from radixkv.model.triton.paged_attention import decode_attention, extend_attention

        q = q.contiguous()
        if meta.decode:
            return decode_attention(
                q, k_cache, v_cache, meta.table, meta.seq_lens,
                scale=scale, max_seq_len=meta.max_seq_len, window=window, q_start=meta.q_start,
            )  # fmt: skip
        return extend_attention(
            q, k_cache, v_cache, meta.table, meta.seq_lens, meta.q_start,
            scale=scale, window=window,
        )  # fmt: skip

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: TritonMeta,
        window: int | None,
        scale: float,
    ) -> torch.Tensor:
        self.write_kv(k_cache, v_cache, k, v, meta)  # invariant: the K/V are in before attend
        return self.attend(q, k_cache, v_cache, meta, window, scale)

    def capture(self, batch: ForwardBatch, max_context: int) -> TritonMeta:
        """Buffers of the batch's shape (requests, tokens), a table `max_context` wide."""
        if batch.slot_table.shape[1] > max_context:
            raise ValueError(
                f"max_context {max_context} is narrower than the batch's table "
                f"({batch.slot_table.shape[1]} slots)"
            )
        dev = batch.slot_table.device
        r, t = batch.num_requests, batch.num_tokens
        meta = TritonMeta(
            out_slots=torch.zeros(t, dtype=batch.out_slots.dtype, device=dev),
            table=torch.zeros((r, max_context), dtype=batch.slot_table.dtype, device=dev),
            seq_lens=torch.zeros(r, dtype=batch.seq_lens_t.dtype, device=dev),
            q_start=torch.zeros(r + 1, dtype=batch.q_start.dtype, device=dev),
            decode=batch.is_decode,
            max_seq_len=max_context,
        )
        self.replay(meta, batch)
        return meta

    def replay(self, meta: TritonMeta, batch: ForwardBatch) -> None:
        """Refill `meta` for `batch` in place (same requests, tokens and kind of step)."""
        width = batch.slot_table.shape[1]
        same = (
            meta.out_slots.shape == batch.out_slots.shape
            and meta.seq_lens.shape == batch.seq_lens_t.shape
            and meta.decode == batch.is_decode
        )
        if not same or width > meta.table.shape[1]:
            raise ValueError("replay needs a batch of the captured shape and kind")
        if max(batch.seq_lens, default=0) > meta.max_seq_len:
            raise ValueError("a context is longer than the captured max_context")
        meta.out_slots.copy_(batch.out_slots)
        meta.table[:, :width].copy_(batch.slot_table)
        meta.table[:, width:].zero_()  # never read: past every seq len (slot 0 is valid memory)
        meta.seq_lens.copy_(batch.seq_lens_t)
        meta.q_start.copy_(batch.q_start)

"""Model runner: turns a ScheduledBatch into a ForwardBatch (slots from the request→token table)
and runs the model under `torch.inference_mode()`."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from radixkv.engine.batch import ForwardBatch
from radixkv.engine.scheduler import ScheduledBatch
from radixkv.memory.pool import KVPool
from radixkv.memory.req_table import ReqToTokenTable


class ForwardModel(Protocol):
    def __call__(self, batch: ForwardBatch, pool: KVPool) -> torch.Tensor: ...


class ModelRunner:
    def __init__(self, model: ForwardModel | Any, pool: KVPool, table: ReqToTokenTable) -> None:
        self.model = model
        self.pool = pool
        self.table = table
        self.device = torch.device(pool.config.device)

    def build(self, sched: ScheduledBatch) -> ForwardBatch:
        ids: list[int] = []
        positions: list[torch.Tensor] = []
        out_slots: list[torch.Tensor] = []
        contexts: list[torch.Tensor] = []
        seq_lens: list[int] = []
        for req, n in zip(sched.reqs, sched.extend_lens, strict=True):
            start, end = req.kv_len, req.kv_len + n
            ids.extend(req.tokens[start:end])
            positions.append(torch.arange(start, end, dtype=torch.int64))
            out_slots.append(self.table.get(req.row, start, end))
            contexts.append(self.table.get(req.row, 0, end))
            seq_lens.append(end)
        return ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.int64, device=self.device),
            positions=torch.cat(positions).to(self.device),
            out_slots=torch.cat(out_slots).to(self.device),
            extend_lens=tuple(sched.extend_lens),
            seq_lens=tuple(seq_lens),
            context_slots=tuple(contexts),
        )

    def forward(self, sched: ScheduledBatch) -> torch.Tensor:
        """Logits [R, vocab] of each request's last new token."""
        batch = self.build(sched)
        with torch.inference_mode():
            logits = self.model(batch, self.pool)
        if logits.shape[0] != batch.num_requests:
            raise RuntimeError(
                f"model returned {logits.shape[0]} logit rows for {batch.num_requests} requests"
            )
        return logits

"""Model runner: turns a ScheduledBatch into a ForwardBatch (slots from the request→token table)
and runs the model under `torch.inference_mode()`."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
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
        ids: list[np.ndarray] = []
        contexts: list[torch.Tensor] = []
        for req, n in zip(sched.reqs, sched.extend_lens, strict=True):
            end = req.kv_len + n
            ids.append(req.tokens[req.kv_len : end])
            contexts.append(self.table.get(req.row, 0, end))
        flat = torch.from_numpy(np.concatenate(ids)) if ids else torch.empty(0, dtype=torch.int64)
        return ForwardBatch.from_contexts(flat, contexts, sched.extend_lens, device=self.device)

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

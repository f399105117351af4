"""Model runner: turns a ScheduledBatch into a ForwardBatch (slots from the request→token table)
and runs the model under `torch.inference_mode()`."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from radixkv.engine.scheduler import ScheduledBatch
from radixkv.memory.pool import KVPool
from radixkv.memory.req_table import ReqToTokenTable
from radixkv.model.batch import ForwardBatch


class ForwardModel(Protocol):
    def __call__(self, batch: ForwardBatch, pool: KVPool) -> torch.Tensor: ...


class ModelRunner:
    def __init__(
        self,
        model: ForwardModel | Any,
        pool: KVPool,
        table: ReqToTokenTable,
        pools: Any = None,
        kinds: Any = None,
    ) -> None:
        self.model = model
        self.pool = pool
        self.table = table
        self.device = torch.device(pool.config.device)
        # Hybrid models: the ModelPools handed to the model, and the memory of its kinds besides
        # FULL (`ComponentMemory`), which gives their slots in the batch, keyed by kind
        # (`ForwardBatch.kind_slots`: the SWA slot table, the state slots).
        self.pools = pools
        self.kinds = kinds
        # Decode graphs (radixkv.engine.graph_runner.attach), None when decode runs eagerly.
        self.graphs: Any = None

    def build(self, sched: ScheduledBatch) -> ForwardBatch:
        """The step's batch: token ids, and each request's slot-table row up to its new length
        gathered from the request → token table(s) in one op; lengths, positions and out slots
        follow as tensors (ForwardBatch.from_table)."""
        ids: list[np.ndarray] = []
        rows: list[int] = []
        ends: list[int] = []
        for req, n in zip(sched.reqs, sched.extend_lens, strict=True):
            end = req.kv_len + n
            ids.append(req.tokens.array(req.kv_len, end))
            rows.append(req.row)
            ends.append(end)
        flat = torch.from_numpy(np.concatenate(ids)) if ids else torch.empty(0, dtype=torch.int64)
        kinds = None if self.kinds is None else self.kinds.batch_slots(sched.reqs, rows, ends)
        return ForwardBatch.from_table(
            flat,
            self.table.gather(rows, ends),
            sched.extend_lens,
            ends,
            device=self.device,
            kind_slots=kinds,
        )

    def compile(self) -> None:
        """Compile the model (if it can be) and warm it up, so that serving never waits on the
        compiler: one forward of two tokens (the dynamic-shape graph every prefill and decode
        batch of >= 2 tokens uses) and one of a single token (its own graph). The warm-up
        writes K/V into the first two pool slots, which the allocator has not handed out yet
        (the caller compiles before any request is admitted), so nothing is disturbed."""
        # Only models that declare a compiled path (nn.Module.compile would wrap any other
        # model's whole forward, batch objects and pools included); the rest run eagerly.
        # Hybrid / SWA models (self.pools set) keep their eager path too.
        if self.pools is not None or not getattr(self.model, "supports_compile", False):
            return
        model: Any = self.model
        model.compile()
        slots = torch.arange(2, dtype=torch.int64, device=self.device)
        with torch.inference_mode():
            self.model(
                ForwardBatch.from_contexts([0, 0], [slots], [2], device=self.device), self.pool
            )
            self.model(ForwardBatch.from_contexts([0], [slots], [1], device=self.device), self.pool)

    def forward(self, sched: ScheduledBatch) -> torch.Tensor:
        """Logits [R, vocab] of each request's last new token."""
        batch = self.build(sched)
        with torch.inference_mode():
            logits = None if self.graphs is None else self.graphs.run(batch)  # None: eager
            if logits is None:
                logits = self.model(batch, self.pool if self.pools is None else self.pools)
        if logits.shape[0] != batch.num_requests:
            raise RuntimeError(
                f"model returned {logits.shape[0]} logit rows for {batch.num_requests} requests"
            )
        return logits

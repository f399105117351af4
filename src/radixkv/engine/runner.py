"""Model runner: turns a ScheduledBatch into a ForwardBatch (slots from the request→token table)
and runs the model under `torch.inference_mode()`."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from radixkv.engine.request import Request
from radixkv.engine.sampling.stop import TextStream
from radixkv.engine.scheduler import ScheduledBatch
from radixkv.engine.types import RequestOptions, SamplingParams
from radixkv.memory.pool import KVPool
from radixkv.memory.req_table import ReqToTokenTable
from radixkv.model.batch import ForwardBatch

if TYPE_CHECKING:
    from radixkv.engine.kv.kv_manager import KVManager

log = logging.getLogger(__name__)


class ForwardModel(Protocol):
    def __call__(self, batch: ForwardBatch, pool: KVPool) -> torch.Tensor: ...


class _NoText:
    """The warm-up request's text decoder: it never decodes a token."""

    def push(self, token_id: int) -> str:
        return ""

    def flush(self) -> str:
        return ""


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

    def compile(self, kv: KVManager) -> str | None:
        """Compile the model's layer stack (if it can be) and warm it up, so that serving never
        waits on the compiler; None when compiled, else why the model runs without it (logged).

        Any model whose layers are all stackable compiles, whatever its pools (FULL, SWA, both):
        the compiled graph calls attention through the KVStep of the step, which carries every
        KV component. The warm-up is one forward of two tokens (the dynamic-shape graph every
        prefill and decode batch of >= 2 tokens uses) and one of a single token (its own graph),
        for a request admitted through `kv` as the scheduler admits one: every kind's slots come
        from that kind's own allocator (slots no request holds), and the request is released
        without handing anything to the tree (it never counts a computed token)."""
        why = getattr(self.model, "why_not_compiled", None)
        reason = why() if callable(why) else "it has no compiled layer stack"
        if reason is not None:
            log.warning("--compile: the model runs without torch.compile: %s", reason)
            return str(reason)
        model: Any = self.model
        model.compile()
        self._warm_up(kv)
        return None

    def _warm_up(self, kv: KVManager) -> None:
        req = Request(
            "compile-warm-up",
            [0, 0],
            SamplingParams(max_tokens=1),
            RequestOptions(),
            TextStream(_NoText()),
            None,
        )
        if kv.admit(req, 0, match=False) is None:
            raise RuntimeError("no memory for the compile warm-up's two tokens")
        try:
            if not kv.grow(req, 2):
                raise RuntimeError("no memory for the compile warm-up's two tokens")
            for n in (2, 1):  # req.kv_len stays 0: the second forward rewrites position 0
                self.forward(ScheduledBatch([req], [n]))
        finally:
            kv.release(req)

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

"""Decode as captured graphs, one per batch-size bucket (issue 35, item 3).

A decode step of R requests runs the forward captured for the smallest bucket >= R (buckets
1, 2, 4, 8, then every 8 up to `max_bs`): the step's tensors are copied into that bucket's static
buffers (token ids, positions, out slots, slot table, lengths) and into the attention backend's
metadata buffers (`AttentionBackend.replay`), the graph is replayed, and the first R rows of its
static logits are handed back (a copy: the next replay overwrites them). The design is the one of
vLLM's and SGLang's CUDA-graph runners: static inputs, the page (slot) table as a graph input,
the metadata refilled outside the graph, buckets captured largest first over one memory pool.

Padding. Rows R..bucket-1 are dummy requests of one token at position 0 whose whole context is
the scratch slot: they write their K/V there and read only it. The scratch slot is the first slot
of a page taken out of the allocator's range at setup (`PageAllocator.reserve_tail`), so no
request, cached prefix or tier ever holds it, and free + cached + held == allocator.num_slots
still balances (the pool's tensors are one page larger than the allocator's range).

Eager fallback (the model's ordinary forward), counted by reason in `fallbacks`: a step with any
prefill, more requests than the largest bucket, a context longer than `max_context`, a batch
asking for all logits, and the whole runner when the capture failed (logged once). Where graphs
cannot run at all there is no runner (`graph_max_bs` is 0): CPU devices, a backend without
`supports_graphs`, hybrid models (several KV components and state slots), or the setting 0.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from radixkv.engine.graph_capture import Captured, Capturer, CudaGraphCapturer
from radixkv.memory.pool import KVPool
from radixkv.model.attention import kv_components
from radixkv.model.batch import ForwardBatch

log = logging.getLogger(__name__)

DEFAULT_MAX_BS = 32  # `--cuda-graph-max-bs` unset: the buckets 1..32 (the default max running)
MAX_GRAPH_CONTEXT = 8192  # longer contexts decode eagerly (the captured table's width)


def buckets(max_bs: int) -> tuple[int, ...]:
    """The captured batch sizes: 1, 2, 4, 8, then every 8, up to and including `max_bs`."""
    if max_bs < 1:
        return ()
    sizes = [b for b in (1, 2, 4) if b < max_bs] + list(range(8, max_bs, 8))
    return tuple(sorted(set(sizes) | {max_bs}))


def graph_max_bs(setting: int | None, device: str | torch.device, model: Any, hybrid: bool) -> int:
    """The largest captured batch size for this engine, 0 when decode stays eager: `setting`
    (--cuda-graph-max-bs; None = DEFAULT_MAX_BS), on a CUDA device, with a backend that
    `supports_graphs`, for a model with one KV component (not a hybrid one)."""
    if setting == 0 or torch.device(device).type != "cuda" or hybrid:
        return 0
    if not getattr(getattr(model, "attention", None), "supports_graphs", False):
        return 0
    if getattr(model, "pool_spec", None) is None:
        return 0
    return DEFAULT_MAX_BS if setting is None else int(setting)


def pad_decode(batch: ForwardBatch, size: int, scratch: int) -> ForwardBatch:
    """`batch` (R one-token requests) with `size - R` dummy requests appended: one token at
    position 0 whose context is the scratch slot alone (it writes and reads only that slot)."""
    r = batch.num_requests
    pad = size - r
    if pad < 0:
        raise ValueError(f"{r} requests do not fit a bucket of {size}")
    if pad == 0:
        return batch
    dev, i64 = batch.slot_table.device, torch.int64
    zeros = torch.zeros(pad, dtype=i64, device=dev)
    ones = torch.ones(pad, dtype=i64, device=dev)
    scratch_t = torch.full((pad,), scratch, dtype=i64, device=dev)
    width = batch.slot_table.shape[1]
    table = torch.full((pad, width), scratch, dtype=batch.slot_table.dtype, device=dev)
    return ForwardBatch(
        input_ids=torch.cat([batch.input_ids, zeros]),
        positions=torch.cat([batch.positions, zeros]),
        out_slots=torch.cat([batch.out_slots, scratch_t]),
        slot_table=torch.cat([batch.slot_table, table]),
        seq_lens_t=torch.cat([batch.seq_lens_t, ones]),
        prefix_lens_t=torch.cat([batch.prefix_lens_t, zeros]),
        extend_lens_t=torch.cat([batch.extend_lens_t, ones]),
        q_start=torch.arange(size + 1, dtype=batch.q_start.dtype, device=dev),
        extend_lens=batch.extend_lens + (1,) * pad,
        seq_lens=batch.seq_lens + (1,) * pad,
    )


@dataclass
class _Bucket:
    """One batch size's static inputs, the backend's metadata per KV component, its graph."""

    size: int
    static: ForwardBatch  # the buffers the captured forward reads
    metas: dict[str, Any]
    graph: Captured | None = None


class GraphRunner:
    """Replays a captured decode forward per bucket; `run` returns None where the step must
    run eagerly (the caller then calls the model)."""

    def __init__(
        self,
        model: Any,
        pool: KVPool,
        max_bs: int,
        max_context: int,
        scratch_slot: int,
        capturer: Capturer,
    ) -> None:
        self.model = model
        self.pool = pool
        self.backend = model.attention
        self.spec = model.pool_spec
        self.sizes = buckets(max_bs)
        self.max_context = min(max_context, MAX_GRAPH_CONTEXT)
        self.scratch = scratch_slot
        self.capturer = capturer
        self.device = pool.k[0].device if pool.k else torch.device(pool.config.device)
        self.buckets: dict[int, _Bucket] = {}
        self.failed: str | None = None  # why capture failed (then every step runs eagerly)
        self.replays = 0
        self.fallbacks: Counter[str] = Counter()

    @property
    def active(self) -> bool:
        return self.failed is None and len(self.buckets) == len(self.sizes)

    def capture_all(self) -> bool:
        """Capture every bucket, largest first (the smaller ones reuse its memory); on any
        failure log it once, drop every graph and stay eager. Writes only the scratch slot."""
        try:
            with torch.inference_mode():
                for size in sorted(self.sizes, reverse=True):
                    self.buckets[size] = self._capture(size)
        except Exception as exc:  # any capture failure means: run eagerly
            self.failed = f"{type(exc).__name__}: {exc}"
            self.buckets.clear()
            log.warning("decode graphs off, capture failed (%s); decoding eagerly", self.failed)
            return False
        log.info("decode graphs captured (%s) for batch sizes %s", self.capturer.name, self.sizes)
        return True

    def _static(self, size: int) -> ForwardBatch:
        """A bucket's buffers, filled as `size` dummy requests on the scratch slot."""
        i64, dev = torch.int64, self.device
        return ForwardBatch(
            input_ids=torch.zeros(size, dtype=i64, device=dev),
            positions=torch.zeros(size, dtype=i64, device=dev),
            out_slots=torch.full((size,), self.scratch, dtype=i64, device=dev),
            slot_table=torch.full((size, self.max_context), self.scratch, dtype=i64, device=dev),
            seq_lens_t=torch.ones(size, dtype=i64, device=dev),
            prefix_lens_t=torch.zeros(size, dtype=i64, device=dev),
            extend_lens_t=torch.ones(size, dtype=i64, device=dev),
            q_start=torch.arange(size + 1, dtype=i64, device=dev),
            extend_lens=(1,) * size,
            seq_lens=(1,) * size,
        )

    def _capture(self, size: int) -> _Bucket:
        static = self._static(size)
        views = kv_components(static, self.pool, self.spec)
        metas = {
            kind: self.backend.capture(view, self.max_context) for kind, (_, view) in views.items()
        }
        bucket = _Bucket(size, static, metas)
        graph_batch = dataclasses.replace(static, attention=metas)
        pool = self.pool

        def forward() -> torch.Tensor:
            return self.model(graph_batch, pool)

        bucket.graph = self.capturer.capture(forward)
        return bucket

    def why_eager(self, batch: ForwardBatch) -> str | None:
        """The reason `batch` runs eagerly, or None when a graph serves it."""
        if not self.active:
            return "capture failed" if self.failed else "not captured"
        if not batch.is_decode:
            return "prefill"
        if batch.return_all_logits or batch.kind_slots:
            return "unsupported batch"
        if batch.num_requests > self.sizes[-1]:
            return "batch too large"
        if max(batch.seq_lens, default=0) > self.max_context or (
            batch.slot_table.shape[1] > self.max_context
        ):
            return "context too long"
        return None

    def bucket_for(self, num_requests: int) -> int:
        return self.sizes[bisect.bisect_left(self.sizes, num_requests)]

    def run(self, batch: ForwardBatch) -> torch.Tensor | None:
        """Logits [R, vocab] of the decode step `batch` through its bucket's graph, or None
        (the reason counted in `fallbacks`) when it must run eagerly."""
        reason = self.why_eager(batch)
        if reason is not None:
            self.fallbacks[reason] += 1
            return None
        bucket = self.buckets[self.bucket_for(batch.num_requests)]
        assert bucket.graph is not None
        padded = pad_decode(batch.to(self.device), bucket.size, self.scratch)
        with torch.inference_mode():
            self._fill(bucket, padded)
            bucket.graph.replay()
            self.replays += 1
            return bucket.graph.output[: batch.num_requests].clone()

    def _fill(self, bucket: _Bucket, padded: ForwardBatch) -> None:
        """Copy the step into the bucket's buffers and its backend metadata (outside the
        graph). Table columns past this step's width keep stale slots, never read (every
        row's length bounds what it reads)."""
        st = bucket.static
        width = padded.slot_table.shape[1]
        for name in ("input_ids", "positions", "out_slots", "seq_lens_t", "prefix_lens_t"):
            getattr(st, name).copy_(getattr(padded, name))
        st.slot_table[:, :width].copy_(padded.slot_table)
        for kind, (_, view) in kv_components(padded, self.pool, self.spec).items():
            self.backend.replay(bucket.metas[kind], view)


def attach(
    runner: Any,
    max_bs: int,
    scratch_slot: int | None,
    max_context: int,
    capturer: Capturer | None = None,
) -> GraphRunner | None:
    """Give the ModelRunner `runner` a GraphRunner over its model and pool, captured now
    (`capturer`: CUDA graphs on the pool's device unless given); None when `max_bs` is 0."""
    if max_bs <= 0 or scratch_slot is None:
        return None
    graphs = GraphRunner(
        runner.model,
        runner.pool,
        max_bs,
        max_context,
        scratch_slot,
        capturer or CudaGraphCapturer(runner.device),
    )
    graphs.capture_all()
    runner.graphs = graphs
    return graphs

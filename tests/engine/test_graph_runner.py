"""Decode graphs per batch-size bucket (radixkv.engine.graph_runner), on the CPU: the CUDA capture
is swapped for `RecordingCapturer` (capture = one call over the static buffers, replay = the call
again over the same buffers), so the static-buffer plumbing, bucket choice, padding on the scratch
slot and slicing run as they do under a CUDA graph; whether every op captures on a GPU is
scripts/gpu_triton.py's to show.

Models: the tiny seeded Llama checkpoint, with the Triton backend (under Triton's interpreter,
tests/conftest.py) and the test-only naive graph backend.
- graph-path logits equal eager bit for bit, for batches that fill a bucket and that need
  padding, and the pool afterwards equals eager's on every slot but the scratch one;
- the fallbacks: prefill, too many requests, too long a context, capture failure (logged once);
  where no runner is made at all: CPU, a backend without graphs, hybrid models, the setting 0;
- the scratch page is outside the allocator's range: never handed out, never freed, and the
  engine's census balances with graphs on, whose outputs equal the eager engine's.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from radixkv.engine import graph_runner
from radixkv.engine.engine import Engine
from radixkv.engine.graph_capture import RecordingCapturer
from radixkv.engine.graph_runner import GraphRunner, buckets, graph_max_bs, pad_decode
from radixkv.engine.types import SamplingParams
from radixkv.memory.allocator import AllocationError, PageAllocator
from radixkv.memory.pool import KVPool
from radixkv.model import load_model
from radixkv.model.attention import TorchAttention
from radixkv.model.batch import ForwardBatch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from naive_attention import NaiveAttention

triton = pytest.importorskip("triton")
from radixkv.model.triton.backend import TritonAttention  # noqa: E402

BACKENDS: dict[str, Callable[[], Any]] = {"triton": TritonAttention, "naive": NaiveAttention}
SLOTS = 96


@pytest.fixture(scope="module")
def llama(tiny_model_dir: Callable[..., Path]) -> Path:
    return tiny_model_dir("llama")


def _setup(path: Path, backend: str, max_bs: int = 8, max_context: int = 48) -> tuple[Any, ...]:
    lm = load_model(path, attention=BACKENDS[backend]())
    pool = KVPool(lm.config.pool_config(SLOTS, torch.float32, "cpu"))
    alloc = PageAllocator(SLOTS, 1)
    scratch = alloc.reserve_tail()
    graphs = GraphRunner(lm.model, pool, max_bs, max_context, scratch, RecordingCapturer())
    assert graphs.capture_all(), graphs.failed
    return lm, pool, alloc, graphs


def _prefilled(lm: Any, pool: KVPool, alloc: PageAllocator, lens: list[int], seed: int) -> Any:
    """Requests with contexts of `lens` tokens in the pool, and their next decode step."""
    g = torch.Generator().manual_seed(seed)
    ctx = [torch.as_tensor(alloc.page_slots(alloc.alloc_pages(n))) for n in lens]
    ids = torch.randint(3, 49152, (sum(lens),), generator=g)
    lm.model(ForwardBatch.from_contexts(ids, ctx, lens), pool)
    nxt = [torch.cat([c, torch.as_tensor(alloc.page_slots(alloc.alloc_pages(1)))]) for c in ctx]
    ids = torch.randint(3, 49152, (len(lens),), generator=g)
    return ForwardBatch.from_contexts(ids, nxt, [1] * len(lens))


def _snapshot(pool: KVPool) -> list[torch.Tensor]:
    return [t.clone() for t in (*pool.k, *pool.v)]


def _restore(pool: KVPool, snap: list[torch.Tensor]) -> None:
    for t, s in zip((*pool.k, *pool.v), snap, strict=True):
        t.copy_(s)


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize(
    "lens", [[9, 4], [6, 11, 3], [5, 2, 13, 7, 8]], ids=["2=bucket", "3->4", "5->8"]
)
def test_graph_decode_equals_eager_and_pads_only_onto_the_scratch_slot(
    llama: Path, backend: str, lens: list[int]
) -> None:
    lm, pool, alloc, graphs = _setup(llama, backend)
    step = _prefilled(lm, pool, alloc, lens, seed=len(lens))
    scratch = graphs.scratch
    for t in (*pool.k, *pool.v):
        t[scratch] = 1e4  # a mark: padded rows overwrite it, real rows never read it
    before = _snapshot(pool)
    want = lm.model(step, pool)
    after_eager = _snapshot(pool)
    _restore(pool, before)
    got = graphs.run(step)
    assert got is not None and graphs.replays == 1 and not graphs.fallbacks
    assert got.shape == want.shape
    assert torch.equal(got, want)
    real = torch.ones(SLOTS, dtype=torch.bool)
    real[scratch] = False
    for t, e in zip((*pool.k, *pool.v), after_eager, strict=True):
        assert torch.equal(t[real], e[real])  # padded rows wrote nothing but the scratch slot
    padded = graphs.bucket_for(len(lens)) > len(lens)
    wrote = [bool((t[scratch] != 1e4).any()) for t in (*pool.k, *pool.v)]
    assert wrote == [padded] * len(wrote)
    # A second step through the same bucket: the buffers are refilled, not stale.
    step2 = _prefilled(lm, pool, alloc, [3] * len(lens), seed=99)
    snap = _snapshot(pool)
    want2 = lm.model(step2, pool)
    _restore(pool, snap)
    assert torch.equal(graphs.run(step2), want2)


def test_pad_decode_points_every_dummy_row_at_the_scratch_slot() -> None:
    step = ForwardBatch.from_contexts(
        [5, 6, 7], [torch.arange(4), torch.arange(4, 6), torch.arange(6, 9)], [1, 1, 1]
    )
    padded = pad_decode(step, 8, scratch=77)
    assert padded.num_requests == 8 and padded.is_decode
    assert padded.seq_lens == (4, 2, 3, 1, 1, 1, 1, 1)
    assert padded.out_slots.tolist() == step.out_slots.tolist() + [77] * 5
    assert padded.positions.tolist()[3:] == [0] * 5
    assert torch.equal(padded.slot_table[:3], step.slot_table)
    assert (padded.slot_table[3:] == 77).all()
    assert padded.q_start.tolist() == list(range(9))
    assert pad_decode(step, 3, 77) is step
    with pytest.raises(ValueError, match="bucket"):
        pad_decode(step, 2, 77)


def test_buckets_and_when_graphs_run_at_all(llama: Path) -> None:
    assert buckets(1) == (1,)
    assert buckets(8) == (1, 2, 4, 8)
    assert buckets(32) == (1, 2, 4, 8, 16, 24, 32)
    assert buckets(20) == (1, 2, 4, 8, 16, 20)
    assert buckets(0) == ()
    triton_lm = load_model(llama, attention=TritonAttention())
    torch_lm = load_model(llama, attention=TorchAttention())
    assert graph_max_bs(None, "cuda", triton_lm.model, hybrid=False) == 32  # the default
    assert graph_max_bs(12, "cuda:0", triton_lm.model, hybrid=False) == 12
    assert graph_max_bs(0, "cuda", triton_lm.model, hybrid=False) == 0  # turned off
    assert graph_max_bs(None, "cpu", triton_lm.model, hybrid=False) == 0  # never on CPU
    assert graph_max_bs(8, "cpu", triton_lm.model, hybrid=False) == 0
    assert graph_max_bs(None, "cuda", torch_lm.model, hybrid=False) == 0  # no supports_graphs
    assert graph_max_bs(None, "cuda", triton_lm.model, hybrid=True) == 0


def test_the_fallbacks_run_eagerly(llama: Path) -> None:
    lm, pool, alloc, graphs = _setup(llama, "naive", max_bs=4, max_context=16)
    prefill = ForwardBatch.from_contexts([3, 4, 5], [torch.tensor([0, 1, 2])], [3])
    assert graphs.run(prefill) is None
    big = _prefilled(lm, pool, alloc, [2] * 5, seed=1)
    assert graphs.run(big) is None
    long = _prefilled(lm, pool, alloc, [20], seed=2)
    assert graphs.run(long) is None
    assert graphs.fallbacks == {"prefill": 1, "batch too large": 1, "context too long": 1}
    assert [graphs.bucket_for(n) for n in range(1, 5)] == [1, 2, 4, 4]  # the smallest that fits
    assert graphs.replays == 0


def test_a_failed_capture_leaves_decode_eager_and_says_so_once(
    llama: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lm = load_model(llama, attention=NaiveAttention())
    pool = KVPool(lm.config.pool_config(SLOTS, torch.float32, "cpu"))
    alloc = PageAllocator(SLOTS, 1)

    class Failing(RecordingCapturer):
        def capture(self, fn: Any) -> Any:
            raise RuntimeError("operation not permitted when stream is capturing")

    graphs = GraphRunner(lm.model, pool, 4, 32, alloc.reserve_tail(), Failing())
    with caplog.at_level(logging.WARNING, logger="radixkv.engine.graph_runner"):
        assert not graphs.capture_all()
        step = _prefilled(lm, pool, alloc, [3, 4], seed=3)
        assert graphs.run(step) is None and graphs.run(step) is None
    assert "not permitted" in (graphs.failed or "")
    assert graphs.fallbacks == {"capture failed": 2} and not graphs.buckets
    assert sum("capture failed" in r.message for r in caplog.records) == 1


def test_the_scratch_page_is_never_handed_out() -> None:
    alloc = PageAllocator(40, page_size=4)
    scratch = alloc.reserve_tail()
    assert scratch == 36 and alloc.num_pages == 9 and alloc.num_slots == 36
    assert alloc.num_slots + alloc.reserved_slots == 40
    pages = alloc.alloc_pages(9)
    assert pages is not None and 9 not in pages and alloc.alloc_pages(1) is None
    alloc.check()
    with pytest.raises(AllocationError):
        alloc.free_page_ids([9])
    alloc.free_page_ids(pages)
    assert alloc.free_slots == 36
    with pytest.raises(AllocationError, match="before"):
        alloc.alloc_pages(1)
        alloc.reserve_tail()


def test_the_engine_decodes_through_graphs_with_the_census_honest(
    llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine with graphs forced on (the CPU capture stand-in): greedy outputs equal the
    eager engine's, decode steps replay, the census balances after every step, and the pool
    is the allocator's range plus the reserved scratch page."""
    prompts = [[5, 9, 14, 3, 8, 2001], [7, 7, 31, 2, 99], [1000, 2000, 3000]]
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    kw = {"device": "cpu", "num_slots": 128, "chunked_prefill_size": 64, "max_running_requests": 4}

    def outputs(engine: Engine) -> list[list[int]]:
        rids = [engine.add_request(p, params) for p in prompts]
        out: dict[str, list[int]] = {r: [] for r in rids}
        while engine.has_unfinished():
            for d in engine.step():
                out[d.request_id].extend(d.new_token_ids)
            engine.check_memory()
        return [out[r] for r in rids]

    eager = Engine(load_model(llama, attention=TritonAttention()), **kw)
    assert eager.runner.graphs is None and eager.allocator.reserved_slots == 0
    want = outputs(eager)
    monkeypatch.setattr(graph_runner, "graph_max_bs", lambda setting, dev, model, hybrid: 64)
    monkeypatch.setattr(graph_runner, "CudaGraphCapturer", lambda device: RecordingCapturer())
    engine = Engine(load_model(llama, attention=TritonAttention()), **kw)
    graphs = engine.runner.graphs
    assert isinstance(graphs, GraphRunner) and graphs.active
    assert graphs.sizes == (1, 2, 4)  # capped at --max-running-requests
    assert engine.allocator.num_slots + engine.allocator.reserved_slots == engine.pool.num_slots
    assert graphs.scratch == engine.allocator.num_slots  # the last slot, outside the range
    assert outputs(engine) == want
    assert graphs.replays >= 4 and graphs.fallbacks["prefill"] >= 1
    m = engine.metrics()
    assert m.graph_replays == graphs.replays and m.graph_fallbacks == dict(graphs.fallbacks)
    assert eager.metrics().graph_replays is None
    from radixkv.server.metrics import ServerMetrics

    text = ServerMetrics(engine.metrics).render().decode()
    assert f"radixkv_decode_graph_replays_total {float(graphs.replays)}" in text
    assert 'radixkv_decode_graph_fallbacks_total{reason="prefill"}' in text
    assert "decode_graph" not in ServerMetrics(eager.metrics).render().decode()


def test_the_cuda_capturer_warms_up_captures_on_its_stream_and_shares_one_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CudaGraphCapturer's calls, against a stand-in for torch.cuda that records them (no GPU
    runs here): warm-up calls on the side stream, then one capture into the shared pool, per
    bucket; replay launches the captured graph."""
    from radixkv.engine.graph_capture import CudaGraphCapturer

    log: list[Any] = []

    class Graph:
        def replay(self) -> None:
            log.append("replay")

    class Ctx:
        def __init__(self, *what: Any) -> None:
            self.what = what

        def __enter__(self) -> None:
            log.append(("enter", *self.what))

        def __exit__(self, *exc: Any) -> None:
            log.append(("exit", self.what[0]))

    class Stream:
        def wait_stream(self, other: Any) -> None:
            pass

    side, pool = Stream(), object()
    fake = {
        "Stream": lambda device: side,
        "graph_pool_handle": lambda: pool,
        "current_stream": lambda device: Stream(),
        "stream": lambda s: Ctx("stream", s),
        "synchronize": lambda device: log.append("sync"),
        "CUDAGraph": Graph,
        "graph": lambda g, pool, stream: Ctx("graph", pool, stream),
    }
    for name, value in fake.items():
        monkeypatch.setattr(torch.cuda, name, value)
    capturer = CudaGraphCapturer("cuda", warmup=2)
    calls: list[str] = []

    def forward() -> torch.Tensor:
        calls.append("call")
        return torch.zeros(1)

    a, b = capturer.capture(forward), capturer.capture(forward)
    assert calls == ["call"] * 6  # 2 warm-up + 1 captured, per bucket
    one = [("enter", "stream", side), ("exit", "stream"), "sync"]
    one += [("enter", "graph", pool, side), ("exit", "graph"), "sync"]
    assert log == one + one  # the same stream and pool for both buckets
    a.replay()
    assert log[-1] == "replay" and a.output is not b.output

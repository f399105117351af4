"""How a decode forward is captured once and replayed: the small protocol under the graph runner
(radixkv.engine.graph_runner), so its static buffers, buckets, padding and slicing run the same
way with a CUDA graph on a GPU and with a recording stand-in on the CPU.

A `Capturer` turns a callable that reads only static buffers into a `Captured`: its `output` is a
tensor whose storage never changes, and `replay()` recomputes it from whatever the static buffers
hold now.

- `CudaGraphCapturer`: `torch.cuda.CUDAGraph` captured under `torch.cuda.graph` on a side
  stream, after warm-up runs (Triton compiles, cuBLAS picks its algorithms, the caching
  allocator settles outside the capture); every bucket's graph shares one memory pool
  (`torch.cuda.graph_pool_handle`), captured largest first so the smaller ones reuse its blocks.
  `replay()` launches the whole graph: no Python, no per-kernel launch cost.
- `RecordingCapturer`: the CPU stand-in for tests. "Capture" runs the callable once and keeps
  its output tensor; "replay" calls it again over the same static buffers and copies the result
  into that tensor. What a CUDA graph would get wrong if the runner forgot to refill a buffer,
  this gets wrong the same way (the callable sees only the static buffers), so the runner's
  plumbing is tested without a GPU; what only a real capture can show (that every op is
  capturable, replay timing) is left to scripts/gpu_triton.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

Forward = Callable[[], torch.Tensor]


class Captured(Protocol):
    """One captured forward: `output` (fixed storage), refreshed by each `replay()`."""

    output: torch.Tensor

    def replay(self) -> None: ...


class Capturer(Protocol):
    """Captures forwards over static buffers (one per batch-size bucket)."""

    name: str

    def capture(self, fn: Forward) -> Captured:
        """Capture `fn` (which reads only static buffers); raises when it cannot be captured."""
        ...


class _Recorded:
    def __init__(self, fn: Forward) -> None:
        self._fn = fn
        self.output = fn()
        self.replays = 0

    def replay(self) -> None:
        self.output.copy_(self._fn())
        self.replays += 1


class RecordingCapturer:
    """The CPU stand-in: capture = one call, replay = the call again, into the same output."""

    name = "recording"

    def __init__(self) -> None:
        self.captured: list[_Recorded] = []

    def capture(self, fn: Forward) -> Captured:
        rec = _Recorded(fn)
        self.captured.append(rec)
        return rec


class _Graph:
    def __init__(self, graph: Any, output: torch.Tensor) -> None:
        self.graph = graph
        self.output = output

    def replay(self) -> None:
        self.graph.replay()


class CudaGraphCapturer:
    """CUDA graphs sharing one memory pool, on `device`."""

    name = "cuda-graph"

    def __init__(self, device: torch.device | str, warmup: int = 2) -> None:
        self.device = torch.device(device)
        self.warmup = warmup
        self.pool: Any = None
        self.stream: Any = None

    def capture(self, fn: Forward) -> Captured:
        cuda = torch.cuda
        if self.stream is None:
            self.stream = cuda.Stream(self.device)
            self.pool = cuda.graph_pool_handle()
        self.stream.wait_stream(cuda.current_stream(self.device))
        with cuda.stream(self.stream):  # warm-up off the default stream, as capture runs
            for _ in range(self.warmup):
                fn()
        cuda.current_stream(self.device).wait_stream(self.stream)
        cuda.synchronize(self.device)
        graph = cuda.CUDAGraph()
        with cuda.graph(graph, pool=self.pool, stream=self.stream):
            output = fn()
        cuda.synchronize(self.device)
        return _Graph(graph, output)

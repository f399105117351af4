"""Live regret: the cache's hit rate over a recent window beside what Belady would have kept.

The engine records each request once, on its first admission: the chained page keys of the
tokens it matched against the cache (no tokens are kept), its prompt length and the tokens the
cache actually served. The window is bounded (oldest requests leave first, by request count and
by page count). Every `every` records, and on demand, `belady` replays the window from an empty
cache at the same capacity (the KV pool, in pages); the two hit rates side by side say how much
a better eviction policy could still win on this traffic. The bound starts cold like the window
itself, so early in a window it is a slight underestimate of an optimal warm cache.

It runs on the engine's thread, so no call may hold it long: the keys are computed vectorized
(`page_keys`), and the periodic replay (tens of milliseconds over a full window) is a resumable
job over a snapshot of the window that `record` and `advance` (once per scheduler step) run for
at most `slice_s` each; `last` changes when a replay ends. `compute` (on demand) runs one whole,
unless `last` already covers the window as it is (nothing recorded since): a poller of an idle
engine pays the replay once, not on every call.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Generator, Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from radixkv.cache.policies.research.belady import (
    BeladyResult,
    belady,
    belady_steps,
    page_keys_array,
)

# (page keys, prompt tokens, served tokens) of a request
_Entry = tuple[npt.NDArray[np.uint64], int, int]


@dataclass(frozen=True)
class RegretReport:
    """Token hit rates over the same window of requests (0.0 on an empty window)."""

    requests: int
    prompt_tokens: int
    live_hit_rate: float  # what the cache served
    belady_hit_rate: float  # the offline optimum at the same capacity
    capacity_tokens: int

    @property
    def regret(self) -> float:
        return max(self.belady_hit_rate - self.live_hit_rate, 0.0)


class RegretWindow:
    """Bounded record of recent requests (page keys only) and the last computed report."""

    def __init__(
        self,
        page_size: int,
        capacity_tokens: int,
        max_requests: int = 2048,
        max_pages: int = 65_536,
        every: int = 256,
        slice_s: float = 0.002,
    ) -> None:
        if page_size < 1 or max_requests < 1 or every < 1:
            raise ValueError("page_size, max_requests and every must be >= 1")
        self.page_size = page_size
        self.capacity_tokens = capacity_tokens
        self.max_requests = max_requests
        self.max_pages = max_pages
        self.every = every
        self.slice_s = slice_s
        # (page keys, prompt tokens, served tokens) per request, oldest first
        self._window: deque[_Entry] = deque()
        self._pages = 0
        self._since = 0
        self.last = RegretReport(0, 0, 0.0, 0.0, capacity_tokens)
        # Records so far, and how many of them `last` covers (its window is the whole window
        # exactly when the two are equal; the empty window's report covers zero).
        self._recorded = 0
        self._last_covers = 0
        # The periodic replay in progress: the window's snapshot, the records it covers and the
        # paused Belady job.
        self._job: tuple[list[_Entry], int, Generator[None, None, BeladyResult]] | None = None

    def __len__(self) -> int:
        return len(self._window)

    def record(
        self,
        query: Sequence[int] | npt.NDArray[np.int64],
        namespace: Hashable | None,
        prompt_tokens: int,
        served_tokens: int,
    ) -> None:
        """One admitted request: `query` is what was matched against the cache."""
        keys = page_keys_array(query, self.page_size, namespace)
        self._window.append((keys, prompt_tokens, served_tokens))
        self._pages += len(keys)
        self._recorded += 1
        while len(self._window) > self.max_requests or (
            self._pages > self.max_pages and len(self._window) > 1
        ):
            self._pages -= len(self._window.popleft()[0])
        self._since += 1
        if self._since >= self.every:
            self.refresh()
        self.advance()

    def refresh(self) -> None:
        """Start a replay of the window as it is now, unless one is in progress (`advance`
        carries it on; `last` changes when it ends)."""
        if self._job is None:
            self._since = 0
            window = list(self._window)
            job = belady_steps([w[0] for w in window], self._capacity_pages(), chunk=256)
            self._job = (window, self._recorded, job)

    @property
    def replaying(self) -> bool:
        """Whether a periodic replay is in progress (`advance` continues it)."""
        return self._job is not None

    def advance(self, budget_s: float | None = None) -> None:
        """Continue the periodic replay for at most about `budget_s` (default `slice_s`)."""
        if self._job is None:
            return
        window, covers, job = self._job
        end = time.perf_counter() + (self.slice_s if budget_s is None else budget_s)
        try:
            while True:
                next(job)
                if time.perf_counter() >= end:
                    return
        except StopIteration as stop:
            self._job = None
            self.last = self._report(window, stop.value)
            self._last_covers = covers

    @property
    def current(self) -> bool:
        """Whether `last` covers the window as it is now (nothing recorded since its replay)."""
        return self._last_covers == self._recorded

    def compute(self) -> RegretReport:
        """The report over the whole window now: `last` when it is `current`, else a replay run
        whole (a periodic replay in progress is dropped); stored as `last`."""
        if self.current:
            return self.last
        self._since = 0
        self._job = None
        window = list(self._window)
        self.last = self._report(window, belady([w[0] for w in window], self._capacity_pages()))
        self._last_covers = self._recorded
        return self.last

    def _capacity_pages(self) -> int:
        return self.capacity_tokens // self.page_size

    def _report(self, window: list[_Entry], opt: BeladyResult) -> RegretReport:
        prompt = sum(w[1] for w in window)
        served = sum(w[2] for w in window)
        best = sum(
            min(h * self.page_size, w[1]) for h, w in zip(opt.hit_pages, window, strict=True)
        )
        return RegretReport(
            len(window),
            prompt,
            served / prompt if prompt else 0.0,
            best / prompt if prompt else 0.0,
            self.capacity_tokens,
        )

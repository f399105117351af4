"""Background storage I/O: every backend call runs off the engine thread.

Two daemon threads (writes, fetches) drain two bounded queues; results come back on one queue
that the engine thread polls (`poll`, `wait`), so all pool and index changes stay on the engine
thread. A full queue refuses the job (the caller treats it as a failed write / an empty fetch).

Health: a StorageError marks the backend unhealthy for a backoff period (doubling up to
`retry_max_s`); meanwhile jobs fail fast without touching the backend, so a dead Redis costs
the engine nothing but recomputation. The first call after the backoff probes again. Both
transitions are logged and counted. A PartialOutage (one node of a sharded store down) fails
only its call: the backend tracks the dead node itself and the rest keeps serving.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from radixkv.storage.base import PartialOutage, StorageBackend, StorageError
from radixkv.storage.codec import CorruptPage, PageMeta, decode_page, encode_page

log = logging.getLogger(__name__)


@dataclass
class WriteDone:
    token: Any
    ok: bool


@dataclass
class FetchDone:
    token: Any
    # Verified payloads of the leading keys found, in order: views into the values read (no
    # copy until the engine thread lands them in L2).
    payloads: list[memoryview]
    # (bytes returned, seconds) per backend round trip, verification included: what the
    # prefetch policy's bandwidth estimate learns from (failed round trips are not timed).
    timings: list[tuple[int, float]] = field(default_factory=list, compare=False)
    # Verified payloads of the job's `extra` keys that were present (a hybrid model's SWA pages
    # and state checkpoints: each one alone, a miss does not end anything), by key.
    extra: dict[str, memoryview] = field(default_factory=dict)


@dataclass
class StorageCounters:
    writes_ok: int = 0
    writes_failed: int = 0
    reads_hit: int = 0
    reads_miss: int = 0
    corrupt: int = 0
    errors: int = 0
    unhealthy_events: int = 0
    refused: int = 0  # jobs refused: queue full or backend in backoff


_STOP = object()


def _as_storage_error(exc: Exception) -> StorageError:
    """A backend's unexpected exception (a client library bug, an unmapped error) counts as a
    storage failure instead of killing the worker thread."""
    if isinstance(exc, StorageError):
        return exc
    log.warning("L3 backend raised %s: %s", type(exc).__name__, exc)
    return StorageError(f"{type(exc).__name__}: {exc}")


class StorageWorker:
    def __init__(
        self,
        backend: StorageBackend,
        meta: PageMeta,
        max_queue: int = 1024,
        retry_base_s: float = 0.5,
        retry_max_s: float = 30.0,
    ) -> None:
        self.backend = backend
        self.meta = meta
        # Values of other kinds, by key suffix ("<hash>-<suffix>"): a hybrid model's SWA pages
        # and state checkpoints. A key's suffix picks the header it must carry (`meta_for`).
        self.metas: dict[str, PageMeta] = {}
        self.counters = StorageCounters()
        self.retry_base_s = retry_base_s
        self.retry_max_s = retry_max_s
        self.fetch_batch = 32  # keys per backend round trip
        self._healthy = True
        self._retry_at = 0.0
        self._backoff = retry_base_s
        self._lock = threading.Lock()  # guards health state and counters
        self._writes: queue.Queue[Any] = queue.Queue(max_queue)
        self._fetches: queue.Queue[Any] = queue.Queue(max_queue)
        self.results: queue.Queue[WriteDone | FetchDone] = queue.Queue()
        self._pending_writes = 0
        self._threads = [
            threading.Thread(target=self._run, args=(q,), daemon=True, name=f"radixkv-l3-{n}")
            for n, q in (("write", self._writes), ("fetch", self._fetches))
        ]
        for t in self._threads:
            t.start()

    # -- engine-thread API ---------------------------------------------------------------------
    @property
    def healthy(self) -> bool:
        return self._healthy

    @property
    def pending_writes(self) -> int:
        return self._pending_writes

    def submit_write(self, token: Any, key: str, payload: Callable[[], bytes | memoryview]) -> bool:
        """Queue a write; False (nothing queued) when refused. `payload` runs on the writer
        thread; it must read memory nobody changes until the WriteDone for `token` is polled."""
        if not self._usable():
            return False
        try:
            self._writes.put_nowait((token, key, payload))
        except queue.Full:
            self._count("refused")
            return False
        with self._lock:
            self._pending_writes += 1
        return True

    def submit_fetch(
        self, token: Any, keys: list[str], extra: list[tuple[int, str]] | None = None
    ) -> bool:
        """Queue a fetch of the leading run of `keys` present and valid in storage, then of
        each `extra` key (need, key) whose `need` <= the length of that run (independently:
        misses are skipped; FetchDone.extra)."""
        if not (keys or extra) or not self._usable():
            return False
        try:
            self._fetches.put_nowait((token, keys, extra or []))
        except queue.Full:
            self._count("refused")
            return False
        return True

    def poll(self, timeout: float = 0.0) -> list[WriteDone | FetchDone]:
        """Results so far; waits up to `timeout` for the first one when there is none."""
        out: list[WriteDone | FetchDone] = []
        try:
            out.append(
                self.results.get(timeout=timeout) if timeout > 0 else self.results.get_nowait()
            )
        except queue.Empty:
            return out
        while True:
            try:
                out.append(self.results.get_nowait())
            except queue.Empty:
                return out

    def drain_writes(self, timeout: float) -> bool:
        """Wait (bounded) until every queued write finished; True when none is left."""
        deadline = time.monotonic() + timeout
        while self._pending_writes > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        return self._pending_writes == 0

    def close(self) -> None:
        for q in (self._writes, self._fetches):
            with contextlib.suppress(queue.Full):
                q.put(_STOP, timeout=1.0)
        for t in self._threads:
            t.join(timeout=2.0)
        self.backend.close()

    # -- health --------------------------------------------------------------------------------
    def _usable(self) -> bool:
        with self._lock:
            if self._healthy or time.monotonic() >= self._retry_at:
                return True
            self.counters.refused += 1
            return False

    def _failed(self, exc: Exception) -> None:
        with self._lock:
            self.counters.errors += 1
            if isinstance(exc, PartialOutage):  # one shard down: that call failed, no backoff
                return
            if self._healthy:
                self.counters.unhealthy_events += 1
                log.warning(
                    "L3 storage (%s) unhealthy: %s; retrying in %.1fs, recomputing meanwhile",
                    self.backend.name,
                    exc,
                    self._backoff,
                )
            else:
                self._backoff = min(self._backoff * 2, self.retry_max_s)
            self._healthy = False
            self._retry_at = time.monotonic() + self._backoff

    def _ok(self) -> None:
        with self._lock:
            if not self._healthy:
                log.info("L3 storage (%s) healthy again", self.backend.name)
            self._healthy = True
            self._backoff = self.retry_base_s

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self.counters, name, getattr(self.counters, name) + n)

    # -- worker threads ------------------------------------------------------------------------
    def meta_for(self, key: str) -> PageMeta:
        """The header a value under `key` must carry: by its registered suffix, else `meta`."""
        _, sep, suffix = key.rpartition("-")
        return self.metas.get(suffix, self.meta) if sep else self.meta

    def _run(self, q: queue.Queue[Any]) -> None:
        while True:
            job = q.get()
            if job is _STOP:
                return
            if q is self._writes:
                self.results.put(WriteDone(job[0], self._write(job[1], job[2])))
                with self._lock:
                    self._pending_writes -= 1
            else:
                timings: list[tuple[int, float]] = []
                payloads = self._fetch(job[1], timings)
                wanted = [k for need, k in job[2] if need <= len(payloads)]
                extra = self._fetch_each(wanted, timings)
                self.results.put(FetchDone(job[0], payloads, timings, extra))

    def _write(self, key: str, payload: Callable[[], bytes | memoryview]) -> bool:
        if not self._usable():
            self._count("writes_failed")
            return False
        try:
            self.backend.put(key, encode_page(key, self.meta_for(key), payload()))
        except Exception as exc:
            self._failed(_as_storage_error(exc))
            self._count("writes_failed")
            return False
        self._ok()
        self._count("writes_ok")
        return True

    def _fetch(self, keys: list[str], timings: list[tuple[int, float]]) -> list[memoryview]:
        """Verified payloads of the leading run of `keys` present in storage, read in batches
        of `fetch_batch` (one round trip each, timed into `timings`); stops at the first miss,
        error or bad value."""
        out: list[memoryview] = []
        for start in range(0, len(keys), self.fetch_batch):
            batch = keys[start : start + self.fetch_batch]
            if not self._usable():
                break
            t0 = time.perf_counter()
            try:
                values = self.backend.get_many(batch)
            except Exception as exc:
                self._failed(_as_storage_error(exc))
                break
            self._ok()
            got = len(out)
            complete = self._take(batch, values, out)
            nbytes = sum(len(p) for p in out[got:])
            timings.append((nbytes, time.perf_counter() - t0))
            if not complete:
                break
        return out

    def _fetch_each(
        self, keys: list[str], timings: list[tuple[int, float]]
    ) -> dict[str, memoryview]:
        """Verified payloads of those `keys` present in storage (a miss or a bad value skips
        that key only), in batches of `fetch_batch`; stops at an error."""
        out: dict[str, memoryview] = {}
        for start in range(0, len(keys), self.fetch_batch):
            batch = keys[start : start + self.fetch_batch]
            if not self._usable():
                break
            t0 = time.perf_counter()
            try:
                values = self._get_each(batch)
            except Exception as exc:
                self._failed(_as_storage_error(exc))
                break
            self._ok()
            nbytes = 0
            for key, value in zip(batch, values, strict=True):
                if value is None:
                    self._count("reads_miss")
                    continue
                payload = self._verify(key, value)
                if payload is not None:
                    out[key] = payload
                    nbytes += len(payload)
                    self._count("reads_hit")
            timings.append((nbytes, time.perf_counter() - t0))
        return out

    def _get_each(self, keys: list[str]) -> list[bytes | None]:
        """Every key's value, misses included (`get_many` may stop at the first miss)."""
        values = self.backend.get_many(keys)
        first = next((i for i, v in enumerate(values) if v is None), len(values))
        return values[: first + 1] + [self.backend.get(k) for k in keys[first + 1 :]]

    def _take(self, batch: list[str], values: list[bytes | None], out: list[memoryview]) -> bool:
        """Append the verified payloads of the leading present values; False at a miss or a
        bad value (the run ends there)."""
        for key, value in zip(batch, values, strict=True):
            if value is None:
                self._count("reads_miss")
                return False
            payload = self._verify(key, value)
            if payload is None:
                return False
            out.append(payload)
            self._count("reads_hit")
        return True

    def _verify(self, key: str, value: bytes) -> memoryview | None:
        """The page's payload, or None after deleting a value that fails verification."""
        try:
            return decode_page(key, self.meta_for(key), value)
        except CorruptPage as exc:
            self._count("corrupt")
            log.warning("L3 page %s failed verification (%s): deleted, recomputing", key, exc)
            try:
                self.backend.delete(key)
            except Exception as del_exc:
                self._failed(_as_storage_error(del_exc))
            return None

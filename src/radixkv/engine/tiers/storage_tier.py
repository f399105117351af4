"""The storage tier (L3) behind the host tier (L2): page writes and prefetches on the storage
thread (`radixkv.storage.worker`), and the prefetch decisions (`radixkv.engine.tiers.prefetch`).

Only the host tier (`engine/tiers/manager.py`) calls this, and every page goes through L2 both ways:
`write` queues the storage copy of a page just added to L2 (pinned there until the write is
confirmed or fails), `start_prefetch` asks for the prompt pages past what L1 and L2 hold, and
`poll` lands verified payloads in L2 (pinned for the request still waiting for them, until its
match). Storage is an optimisation: a slow, dead or corrupt backend costs time, never
correctness (what does not arrive is recomputed; what fails verification is a miss).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, Protocol

from radixkv.cache.tiers import HostIndex
from radixkv.engine.tiers.prefetch import PrefetchPolicy
from radixkv.memory.host_pool import HostKVPool
from radixkv.storage.worker import FetchDone, StorageWorker, WriteDone

FULL = ""  # the key suffix of full-attention pages (their keys are the bare hash)


class HostPages(Protocol):
    """A host pool of one component (HostKVPool, HostStatePool): bytes in and out."""

    @property
    def page_bytes(self) -> int: ...

    def page_payload(self, page: int) -> bytes | memoryview: ...

    def write_payload(self, page: int, payload: bytes | memoryview) -> None: ...


class StorageTier:
    def __init__(
        self, index: HostIndex, host: HostKVPool, worker: StorageWorker, prefetch: PrefetchPolicy
    ) -> None:
        self.index = index
        self.host = host
        # Every component's L2 (index, pool) by key suffix: FULL, and a hybrid model's others
        # (`add_store`); a value is stored under "<hash hex>[-<suffix>]".
        self.stores: dict[str, tuple[HostIndex, HostPages]] = {FULL: (index, host)}
        self.worker = worker
        self.prefetch = prefetch
        prefetch.fetch_batch = worker.fetch_batch
        self.prefetch_started = 0
        self._fetch_ids = 0
        # fetch id -> (request, FULL hashes, the extra keys asked: key -> (suffix, hash))
        self._fetching: dict[int, tuple[str, list[bytes], dict[str, tuple[str, bytes]]]] = {}
        self._req_fetch: dict[str, int] = {}  # request id -> its fetch id
        self._fetch_first: dict[int, str] = {}  # fetch id -> what was known of its first page
        # Host pages (suffix, page) a request's prefetch landed, pinned until its match.
        self._req_pins: dict[str, list[tuple[str, int]]] = {}
        self._held: dict[str, float] = {}  # request id -> when its hold began (monotonic)
        self._stored: set[tuple[str, bytes]] = set()  # confirmed in L3 (skip rewriting them)
        self.journal: list[bytes] | None = None  # FULL hashes newly known in L3 (KV events)

    def add_store(self, suffix: str, index: HostIndex, host: HostPages) -> None:
        """Another component's L2, stored under keys "<hash hex>-<suffix>"."""
        if not suffix or "-" in suffix or suffix in self.stores:
            raise ValueError(f"bad or duplicate component suffix {suffix!r}")
        self.stores[suffix] = (index, host)

    @staticmethod
    def key(h: bytes, suffix: str = FULL) -> str:
        return h.hex() + (f"-{suffix}" if suffix else "")

    def write(self, hp: int, h: bytes, suffix: str = FULL) -> None:
        """Queue the storage copy of L2 page `hp` (hash `h`) of component `suffix` unless L3
        has it already."""
        if (suffix, h) in self._stored:
            return
        index, host = self.stores[suffix]
        index.pin(hp)  # unpinned when the write is confirmed or fails (poll)
        token = (suffix, hp, h)
        if not self.worker.submit_write(token, self.key(h, suffix), lambda: host.page_payload(hp)):
            index.unpin(hp)

    # -- prefetch ------------------------------------------------------------------------------
    def start_prefetch(
        self,
        request_id: str,
        want: list[bytes],
        in_l2: list[int],
        page_size: int,
        extra: Sequence[tuple[int, str, bytes]] = (),
        extra_in_l2: Sequence[tuple[str, int]] = (),
        local: bool = False,
    ) -> float | None:
        """Fetch the pages `want` (the prompt's pages past L1 and the L2 pages `in_l2`), and
        each `extra` value (need, suffix, hash) of another component whose `need` <= the run
        of `want` found; decide whether the request waits for them: the longest it may be
        held (seconds), or None. A held request's L2 pages (`in_l2`, `extra_in_l2`) are pinned
        until `unpin_request` (its match). `local`: `want` continues pages L1/L2 hold (what the
        policy knows of the first page: FIRST_KINDS)."""
        queued = sum(len(h) for _, h, _ in self._fetching.values())
        # The found share is learnt apart by what is known of the first page: a conversation's
        # new turn (an extension) is never in L3, a restarted server's prompt (cold) may be.
        first = self._first_kind(want, local)
        known = 0  # the leading pages of `want` this replica confirmed in L3
        while known < len(want) and (FULL, want[known]) in self._stored:
            known += 1
        d = self.prefetch.decide(
            max(1, len(want)),
            page_size,
            self.host.page_bytes,
            self.worker.healthy,
            queued,
            first,
            known,
        )
        fid = self._fetch_ids = self._fetch_ids + 1
        asked = {self.key(h, sfx): (sfx, h) for _, sfx, h in extra}
        extra_keys = [(need, self.key(h, sfx)) for need, sfx, h in extra]
        if self.worker.submit_fetch(fid, [h.hex() for h in want], extra_keys):
            self._fetching[fid] = (request_id, want, asked)
            self._req_fetch[request_id] = fid
            self._fetch_first[fid] = first
            self.prefetch_started += 1
        elif d.wait:
            d = dataclasses.replace(d, wait=False, bound_s=0.0, reason="refused")
        self.prefetch.count(d)
        if not d.wait:
            return None
        pins = [(FULL, hp) for hp in in_l2] + list(extra_in_l2)
        for sfx, hp in pins:
            self.stores[sfx][0].pin(hp)
        self._req_pins.setdefault(request_id, []).extend(pins)
        self._held[request_id] = time.monotonic()
        return d.bound_s

    def _first_kind(self, want: list[bytes], local: bool) -> str:
        """FIRST_KINDS of `want[0]`: known in L3 by this replica, else an extension of a local
        prefix, else cold (no FULL page asked: known, nothing of it can miss)."""
        if not want or (FULL, want[0]) in self._stored:
            return "known"
        return "extension" if local else "cold"

    def prefetch_pending(self, request_id: str) -> bool:
        fid = self._req_fetch.get(request_id)
        return fid is not None and fid in self._fetching

    def end_hold(self, request_id: str) -> None:
        """`request_id`'s hold ended (its fetch finished or its bound passed)."""
        start = self._held.pop(request_id, None)
        if start is not None:
            timed_out = self.prefetch_pending(request_id)
            self.prefetch.released(time.monotonic() - start, timed_out)

    def unpin_request(self, request_id: str) -> None:
        for sfx, hp in self._req_pins.pop(request_id, []):
            self.stores[sfx][0].unpin(hp)

    def forget(self, request_id: str) -> None:
        self._req_fetch.pop(request_id, None)
        self._held.pop(request_id, None)
        self.unpin_request(request_id)

    # -- results -------------------------------------------------------------------------------
    def poll(self, timeout: float = 0.0) -> int:
        """Apply finished storage jobs: confirmed writes unpin their L2 page; fetched pages are
        copied into L2 (marked as coming from storage). Returns how many pages landed."""
        landed = 0
        for res in self.worker.poll(timeout):
            if isinstance(res, WriteDone):
                sfx, hp, h = res.token
                self.stores[sfx][0].unpin(hp)
                if res.ok:
                    self._known(h, sfx)
            elif isinstance(res, FetchDone):
                self.prefetch.observe_fetch(res.timings)
                hashes = self._fetching.get(res.token, ("", [], {}))[1]
                first = self._fetch_first.pop(res.token, "known")
                self.prefetch.observe_found(first, len(res.payloads), len(hashes))
                if len(res.payloads) < len(hashes):  # the first page the run missed: not in L3
                    self._stored.discard((FULL, hashes[len(res.payloads)]))
                landed += self._land(res)
        return landed

    def _land(self, res: FetchDone) -> int:
        # Landed even if its request is gone: the pages are verified and likely wanted again;
        # pinned for a request still waiting, so other landings cannot push them out first.
        rid, hashes, asked = self._fetching.pop(res.token, ("", [], {}))
        live = self._req_fetch.get(rid) == res.token
        found = [(FULL, h, p) for h, p in zip(hashes, res.payloads, strict=False)]
        found += [(*asked[k], p) for k, p in res.extra.items() if k in asked]
        todo: dict[str, list[tuple[bytes, memoryview]]] = {}  # by component, in prompt order
        for sfx, h, payload in found:
            self._known(h, sfx)
            if self.stores[sfx][0].lookup(h) is None:
                todo.setdefault(sfx, []).append((h, payload))
        landed = 0
        for sfx, items in todo.items():
            index, host = self.stores[sfx]
            n = min(len(items), index.free_pages + index.cached_pages)  # the leading ones fit
            got = index.alloc(n) if n else None
            if not got:
                continue
            # In ascending page order: a fetched run lands in runs of consecutive host pages,
            # which L2 -> L1 loads copy straight from a view of the pool (HostKVPool.load).
            for hp, (h, payload) in zip(sorted(got), items, strict=False):
                host.write_payload(hp, payload)
                index.add(h, hp, origin="storage")
                landed += sfx == FULL
                if live:
                    index.pin(hp)
                    self._req_pins.setdefault(rid, []).append((sfx, hp))
        return landed

    @property
    def known_hashes(self) -> frozenset[bytes]:
        """The (FULL) page hashes this replica knows are in L3 (confirmed writes, verified
        fetches)."""
        return frozenset(h for sfx, h in self._stored if sfx == FULL)

    def _known(self, h: bytes, sfx: str = FULL) -> None:
        """`h` of component `sfx` is in L3 (a confirmed write or a verified fetch)."""
        if (sfx, h) not in self._stored:
            self._stored.add((sfx, h))
            if self.journal is not None and sfx == FULL:
                self.journal.append(h)

    def stats(self) -> dict[str, Any]:
        w, c = self.worker, self.worker.counters
        return {
            "storage_healthy": int(w.healthy),
            "storage_pending_writes": w.pending_writes,
            "storage_writes_ok": c.writes_ok,
            "storage_writes_failed": c.writes_failed,
            "storage_reads_hit": c.reads_hit,
            "storage_reads_miss": c.reads_miss,
            "storage_corrupt": c.corrupt,
            "storage_errors": c.errors,
            "storage_unhealthy_events": c.unhealthy_events,
            **self.prefetch.stats(),
        }

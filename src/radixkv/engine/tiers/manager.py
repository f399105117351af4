"""The hierarchical cache: host memory (L2) and storage (L3) beside the radix tree (L1).

The tiers are called and never call back: they own L2 (host pages) and the L3 traffic, never a
device slot, the tree or a request's lock; they import neither the tree nor the KV manager.
They are indexed by chained page hashes (`radixkv.cache.tiers`), and the KV manager, the only
code that moves device slots, tells them what the tree did: pages it adopted (`on_insert`),
pages it is about to free (`on_evict`), pages a match hit (`on_l1_hit`). Page flow:

- write_through: every page the tree adopts is copied to L2 at once; write_through_selective:
  on its first L1 hit (its second use); write_back: when L1 evicts it. Copies to L2 are
  synchronous, so a page leaves L1 only with its L2 copy complete. A copy L2 has no room for
  (every L2 page pinned: pending L3 writes, fetched pages of held requests) is not lost: the
  page is copied down when L1 evicts it, as under write_back (`_unsaved`). With L3, each new
  L2 page is also written to storage; the L2 page is pinned (not evictable) until the write is
  confirmed.
- kinds: a model with other kinds of KV besides FULL (sliding-window K/V, recurrent-state
  checkpoints) has one store per kind (`stores`, engine/tiers/kind_store.py), under the same
  page hashes; the tree's memory reports what it adopted of them (`on_kinds_insert`), each
  store says what it keeps. A FULL-only model has none.
- match: after the L1 match, `plan_load` finds the deepest boundary L1 + L2 can resume at
  (FULL pages reach it and every kind holds what it needs there) and names the L2 values up to
  it (a `LoadPlan`); the KV manager allocates device memory of every kind for them, `load`
  copies them down, and the KV manager inserts them into the tree and moves the request's lock
  onto the longer prefix.
- L3 (`StorageTier`, engine/tiers/storage_tier.py, behind L2): `start_prefetch` (at arrival) fetches
  the pages past L1/L2 on the storage thread and decides, by the prefetch policy
  (`radixkv.engine.tiers.prefetch`), whether the request waits for them (the KV manager holds it);
  verified payloads land in L2 when the engine polls, where `plan_load` finds them. What L1 and
  L2 hold is never waited for (a held request's L2 pages are pinned until its match); what has
  not arrived by admission is recomputed.

Device map invariant: `_dev_hash[p]` exists only for device pages the tree owns (adopted on
insert, dropped on evict/reset; `device_pages`, checked by the KV manager), so a slot is never
copied after it was freed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from radixkv.cache.tiers import HostIndex
from radixkv.config.sections import WRITE_POLICIES
from radixkv.engine.request import Request
from radixkv.engine.tiers.kind_store import KindStore
from radixkv.engine.tiers.prefetch import PrefetchPolicy
from radixkv.engine.tiers.storage_tier import StorageTier
from radixkv.engine.tiers.tier_loads import LoadPlan, TierLoads, _key
from radixkv.engine.tiers.tier_residency import TierOp, TierResidency
from radixkv.memory.host_pool import HostKVPool
from radixkv.memory.pool import KVPool
from radixkv.storage import PageMeta, make_backend
from radixkv.storage.worker import StorageWorker

log = logging.getLogger(__name__)

MAX_PREFETCH_PAGES = 4096

__all__ = ["LoadPlan", "TierManager"]


class TierManager(TierLoads):
    """L2 (host pools indexed by page hash: FULL's, and one store per other kind) and, with a
    backend, L3 behind it (`storage`, engine/tiers/storage_tier.py). Called by the KV manager
    and the engine; calls neither. Plans and loads: `TierLoads` (engine/tiers/tier_loads.py)."""

    def __init__(
        self,
        kv_pool: KVPool,
        page_size: int,
        host_pages: int,
        write_policy: str,
        fingerprint: str,
        storage: tuple[str, str] | None = None,
        storage_timeout_s: float = 1.0,
        prefetch: PrefetchPolicy | None = None,
        stores: Sequence[KindStore] = (),
    ) -> None:
        """`kv_pool`: the FULL device pool (its pages carry the hashes); `stores`: the model's
        other kinds the tiers keep (engine/tiers/tier_setup.py builds them)."""
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"unknown write policy {write_policy!r} ({', '.join(WRITE_POLICIES)})")
        host = HostKVPool(kv_pool, host_pages, page_size)
        super().__init__(page_size, fingerprint, host, HostIndex(host_pages), stores)
        self.write_policy = write_policy
        self._dev_hash: dict[int, bytes] = {}
        # Tree-owned device pages whose write-through copy found no room in L2 (a subset of
        # `_dev_hash`): copied down when L1 evicts them, or at shutdown.
        self._unsaved: set[int] = set()
        self._device_pages = kv_pool.num_slots // page_size
        if storage is not None:
            meta = PageMeta(
                fingerprint=fingerprint,
                dtype=str(kv_pool.config.dtype).removeprefix("torch."),
                num_layers=kv_pool.config.num_layers,
                page_size=page_size,
                shape=self.host.page_shape,
                length=self.host.page_bytes,
            )
            worker = StorageWorker(make_backend(*storage, timeout_s=storage_timeout_s), meta)
            self.storage = StorageTier(self.index, self.host, worker, prefetch or PrefetchPolicy())
            for kind, store in self.stores.items():
                worker.metas[kind] = store.meta()
                self.storage.add_store(kind, store.index, store.host)

    @property
    def has_storage(self) -> bool:
        """An L3 backend is attached (prefetches and writes go to it)."""
        return self.storage is not None

    @property
    def worker(self) -> StorageWorker | None:
        """The storage thread (None without L3, or after `close`)."""
        return self.storage.worker if self.storage is not None else None

    # -- residency (KV events) -----------------------------------------------------------------
    def announce_residency(self) -> None:
        """Record which pages enter and leave L2 and L3 from now on (`residency_ops` drains)."""
        if self.residency is None:
            cap = 2 * (self._device_pages + self.index.num_pages) + MAX_PREFETCH_PAGES
            self.residency = TierResidency(cap)
            self.index.journal = []
            if self.storage is not None:
                self.storage.journal = []

    def residency_ops(self) -> list[TierOp]:
        """The L2/L3 residency changes since the last call, in order ([] when not announced)."""
        if self.residency is None:
            return []
        l3 = self.storage.journal if self.storage is not None else None
        return self.residency.take_journals(self.index.journal, l3)

    def forget(self, req: Request) -> None:
        """`req` (one choice) finished: drop its bookkeeping."""
        self._hashes.pop(_key(req), None)
        self._loaded.pop(_key(req), None)
        if self.storage is not None:
            self.storage.forget(req.request_id)

    # -- tree hooks (called by KVManager) ------------------------------------------------------
    def on_insert(self, req: Request, slots: np.ndarray, cached: int, aligned: int) -> None:
        """The tree adopted slots[cached:aligned] for req.tokens[cached:aligned]."""
        if aligned <= cached:
            return
        ps = self.page_size
        hs = self.hashes(req, aligned)[cached // ps : aligned // ps]
        pages = [int(s) // ps for s in slots[cached:aligned:ps]]
        for p, h in zip(pages, hs, strict=True):
            self._dev_hash[p] = h
        if self.write_policy == "write_through":
            self._save(pages, hs)

    def on_l1_hit(self, slots: np.ndarray) -> None:
        """write_through_selective: pages used a second time (an L1 hit) get their L2 copy."""
        if self.write_policy != "write_through_selective" or not len(slots):
            return
        pages = [int(s) // self.page_size for s in slots[:: self.page_size]]
        todo = [(p, self._dev_hash[p]) for p in pages if p in self._dev_hash]
        todo = [(p, h) for p, h in todo if self.index.lookup(h, touch=False) is None]
        if todo:
            self._save([p for p, _ in todo], [h for _, h in todo])

    def on_evict(self, slots: np.ndarray, demote: bool = True) -> None:
        """L1 is about to free these slots (whole pages): write_back copies them down first
        (`demote=False`: a flush, nothing is copied)."""
        pages = [int(s) // self.page_size for s in np.asarray(slots)[:: self.page_size]]
        hashed = [(p, self._dev_hash.pop(p)) for p in pages if p in self._dev_hash]
        if demote and self.write_policy != "write_back":
            hashed = [(p, h) for p, h in hashed if p in self._unsaved]  # copies L2 had no room for
        if demote and hashed:
            self._save([p for p, _ in hashed], [h for _, h in hashed])
        self._unsaved.difference_update(pages)

    def _save(self, dev_pages: list[int], hashes: list[bytes]) -> None:
        """Copy device pages to L2 (those not there yet, as many as fit) and queue L3 writes."""
        todo = [
            (p, h) for p, h in zip(dev_pages, hashes, strict=True) if self.index.lookup(h) is None
        ]
        n = min(len(todo), self.index.free_pages + self.index.cached_pages)
        dropped = [p for p, _ in todo[n:] if p in self._dev_hash]  # still in L1: retried later
        self._unsaved.update(dropped)
        self.counters.host_save_dropped_pages += len(todo) - n
        if n == 0:
            return
        todo = todo[:n]
        self._unsaved.difference_update(p for p, _ in todo)
        host_pages = self.index.alloc(n)
        assert host_pages is not None
        self.host.save([p for p, _ in todo], host_pages)
        for hp, (_, h) in zip(host_pages, todo, strict=True):
            self.index.add(h, hp)
            if self.storage is not None:
                self.storage.write(hp, h)
        self.counters.host_saved_pages += n

    def end_match(self, req: Request) -> None:
        """req's match through the tiers is over: its prefetched L2 pages have served their
        turn (they were pinned from its hold until now)."""
        if self.storage is not None:
            self.storage.unpin_request(req.request_id)

    # -- L3 prefetch ---------------------------------------------------------------------------
    def start_prefetch(self, req: Request, l1_tokens: int) -> float | None:
        """At arrival (`l1_tokens`: the prompt's page-floored L1 match): ask storage for the
        prompt's pages past what L1 and L2 hold, and decide by the prefetch policy whether `req`
        waits for them. Returns the longest it may be held (seconds; poll() lands its pages in
        L2, `end_hold` ends the hold), or None: schedule it now. Only the storage part is waited
        for; a held request's L2 pages are pinned until its match (`end_match`), so the wait
        cannot cost it what L2 already had. Every other kind's values of the pages past the
        L1 match that L2 lacks are asked too, each fetched only if the FULL run found reaches its
        page (they are useless past it)."""
        if self.storage is None:
            return None
        hs, have, in_l2 = self._l2_run(req, l1_tokens)
        want = hs[have : have + MAX_PREFETCH_PAGES]
        extra: list[tuple[int, str, bytes]] = []
        extra_in_l2: list[tuple[str, int]] = []
        pages = range(l1_tokens // self.page_size, min(len(hs), have + MAX_PREFETCH_PAGES))
        for kind, store in self.stores.items():
            for p in pages:
                hp = store.index.lookup(hs[p], touch=False)
                if hp is None:
                    extra.append((p + 1 - have, kind, hs[p]))
                else:
                    extra_in_l2.append((kind, hp))
        if not want and not extra:
            return None
        return self.storage.start_prefetch(
            req.request_id, want, in_l2, self.page_size, extra, extra_in_l2, local=have > 0
        )

    def _l2_run(self, req: Request, l1_tokens: int) -> tuple[list[bytes], int, list[int]]:
        """The prompt's page hashes (whole pages of all but its last token), the page index
        where L1 + L2 stop holding it, and the L2 pages of that run past L1, in order."""
        ps = self.page_size
        n_pages = (len(req.tokens) - 1) // ps
        have = l1_tokens // ps
        hs = self.hashes(req, n_pages * ps)
        in_l2: list[int] = []
        while have < n_pages:
            hp = self.index.lookup(hs[have], touch=False)
            if hp is None:
                break
            in_l2.append(hp)
            have += 1
        return hs, have, in_l2

    def end_hold(self, request_id: str) -> None:
        """The engine ends `request_id`'s hold (its fetch finished or its bound passed)."""
        if self.storage is not None:
            self.storage.end_hold(request_id)

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """A forward step with prefill tokens took `seconds` (the recompute side of the cost
        model; only measured when there is storage to weigh it against)."""
        if self.storage is not None:
            self.storage.prefetch.observe_prefill(tokens, seconds)

    def prefetch_pending(self, request_id: str) -> bool:
        return self.storage is not None and self.storage.prefetch_pending(request_id)

    def poll(self, timeout: float = 0.0) -> None:
        """Apply finished storage jobs (confirmed writes, fetched pages landing in L2)."""
        if self.storage is not None:
            self.counters.prefetch_pages += self.storage.poll(timeout)

    # -- whole-tier operations -----------------------------------------------------------------
    def flush(self, device_reset: bool) -> None:
        """/flush_cache: drop every unpinned L2 page (L3 is shared and kept); after an L1 reset
        no device page is tree-owned any more."""
        if device_reset:
            self._dev_hash.clear()
            self._unsaved.clear()
        self.index.clear()
        for store in self.stores.values():
            store.index.clear()
        if device_reset:
            self.residency_ops()  # dropped: consumers are told AllBlocksCleared

    def close(self, tree_pages: set[int], timeout_s: float = 5.0) -> bool:
        """Flush pending L3 writes (bounded by `timeout_s`) and stop the storage threads; True
        when nothing was left unwritten. `tree_pages`: the device pages the tree owns now."""
        if self.storage is None:
            return True
        # Pages only L1 holds (write_back / selective; under write_through those L2 had no
        # room for) reach storage through L2 now, as many as L2 can stage; the rest of L1 is
        # lost with the process.
        every = self.write_policy != "write_through"
        todo = [
            (p, h)
            for p, h in self._dev_hash.items()
            if p in tree_pages and (every or p in self._unsaved)
        ]
        if todo:
            self._save([p for p, _ in todo], [h for _, h in todo])
        done = self.storage.worker.drain_writes(timeout_s)
        self.poll()
        self.storage.worker.close()
        self.storage = None
        if not done:
            log.warning("L3 flush timed out after %.1fs; unwritten pages are lost", timeout_s)
        return done

    def stats(self) -> dict[str, Any]:
        free, cached, held = self.index.census()
        ps = self.page_size
        out: dict[str, Any] = {
            "host_pool_pages": self.index.num_pages,
            "host_free_pages": free,
            "host_cached_pages": cached,
            "host_held_pages": held,
            "host_cached_tokens": (cached + held) * ps,
            "host_hit_tokens": self.counters.host_hit_tokens,
            "storage_hit_tokens": self.counters.storage_hit_tokens,
            "host_saved_pages": self.counters.host_saved_pages,
            "host_save_dropped_pages": self.counters.host_save_dropped_pages,
            "storage_prefetch_pages": self.counters.prefetch_pages,
        }
        for kind, store in self.stores.items():
            free, cached, held = store.index.census()
            out[f"host_{kind}_pool_pages"] = store.index.num_pages
            out[f"host_{kind}_free_pages"] = free
            out[f"host_{kind}_cached_pages"] = cached
            out[f"host_{kind}_held_pages"] = held
            out[f"host_{kind}_saved"] = store.saved
        if self.storage is not None:
            out.update(self.storage.stats())
        return out

    def check(self) -> None:
        """Every host census balances (FULL's and each kind's; the device pages FULL maps:
        `device_pages`); every page waiting for its L2 copy is one the tree owns."""
        self.index.check()
        for store in self.stores.values():
            store.index.check()
        assert self._unsaved <= self._dev_hash.keys(), "an unsaved page the tree does not own"

    def device_pages(self) -> set[int]:
        """The device pages the tiers know the hashes of; each must be one the tree owns now
        (checked by the KV manager), so a slot is never copied after it was freed."""
        return set(self._dev_hash)

"""The L2 -> L1 half of the tier manager, the same for every kind of KV: the base class of
`TierManager` (engine/tiers/manager.py), which adds the write policies, the device map and L3.

Every value in the tiers is keyed by a chained page hash of the request's tokens (`hashes`):
FULL pages in the manager's own host pool (`index`, `host`), each other kind's values in its
store (`stores`, by kind; engine/tiers/kind_store.py). The tree's memory reports what the tree
adopted of each kind (`on_kinds_insert`; FULL pages come through the manager's `on_insert`);
after a match, `plan_load` votes over what L1 and L2 hold as the tree's components vote
(`cache/hybrid/tier_vote.py`) and returns a `LoadPlan` with a part per kind; the KV manager
allocates device memory of every kind for it (engine/kv/tier_load.py) and `load` copies the
plan's values down. Nothing here moves a device slot, the tree or a request's lock.

Census per L2 index (FULL's and each store's) after every call: free + cached + held == its
pages (`HostIndex.check`); held values are pinned (a pending L3 write, a plan until its load).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from radixkv.cache.tiers import HostIndex, chain_hashes, namespace_seed
from radixkv.engine.request import Request
from radixkv.engine.tiers.kind_store import KindPart, KindStore
from radixkv.engine.tiers.storage_tier import StorageTier
from radixkv.engine.tiers.tier_residency import TierResidency
from radixkv.memory.host_pool import HostKVPool


@dataclass
class TierCounters:
    host_hit_tokens: int = 0  # loaded L2 -> L1 (pages that were copied down from L1)
    storage_hit_tokens: int = 0  # loaded L2 -> L1 (pages that came up from L3)
    host_saved_pages: int = 0
    host_save_dropped_pages: int = 0  # not copied to L2: every L2 page was pinned
    prefetch_pages: int = 0  # landed in L2 from L3


@dataclass
class LoadPlan:
    """What L2 holds to extend one choice's L1 match of `start` tokens to `boundary` tokens
    (`TierManager.plan_load`): FULL pages (`host_pages`, in prompt order) for [full_from,
    boundary) (the tree has FULL K/V before `full_from`), and each other kind's values a resume
    at `boundary` needs (`parts`, by kind). All pinned until `load`."""

    key: tuple[str, int]  # the choice (request id, index)
    host_pages: list[int]
    start: int = 0
    full_from: int = 0
    boundary: int = 0
    parts: dict[str, KindPart] = field(default_factory=dict)


class TierLoads:
    """Page hashes, L2 by kind and the load plans (see the module docstring)."""

    def __init__(
        self,
        page_size: int,
        fingerprint: str,
        host: HostKVPool,
        index: HostIndex,
        stores: Sequence[KindStore],
    ) -> None:
        self.page_size = page_size
        self.fingerprint = fingerprint
        self.host = host
        self.index = index
        self.stores: dict[str, KindStore] = {s.kind: s for s in stores}  # by kind, FULL aside
        self.counters = TierCounters()
        # Per choice (the n choices of one request share its id but not their outputs):
        self._hashes: dict[tuple[str, int], list[bytes]] = {}  # chained page hashes so far
        self._loaded: dict[tuple[str, int], list[int]] = {}  # [host, storage] tokens loaded
        # Residency for KV events ("CPU"/"DISK" blocks); None until announced (the manager).
        self.residency: TierResidency | None = None
        self.storage: StorageTier | None = None  # L3, set by the manager

    # -- hashes --------------------------------------------------------------------------------
    def hashes(self, req: Request, num_tokens: int) -> list[bytes]:
        """Chained hashes of the whole pages of req.tokens[:num_tokens] (cached, extended)."""
        have = self._hashes.get(_key(req), [])
        need = num_tokens // self.page_size
        if len(have) < need:
            seed = namespace_seed(self.fingerprint, req.namespace)
            done = len(have)
            have = chain_hashes(req.tokens[: need * self.page_size], self.page_size, seed, have)
            self._hashes[_key(req)] = have
            if self.residency is not None:
                self.residency.note_chain(req.tokens, have, done, self.page_size, req.namespace)
        return have[:need]

    def loaded_split(self, req: Request) -> tuple[int, int]:
        """(host, storage) prompt tokens this choice loaded from the lower tiers; forgets it."""
        host, storage = self._loaded.pop(_key(req), [0, 0])
        return host, storage

    def on_kinds_insert(
        self, req: Request, parts: Mapping[str, Any], cached: int, aligned: int
    ) -> None:
        """The tree adopted req.tokens[cached:aligned] (FULL: `on_insert`) with `parts`, what
        it holds of each other kind (by kind): each store's values to keep go to its L2 (and are
        queued for L3)."""
        if not self.stores:
            return
        marks = tuple(
            m for k, part in parts.items() if k in self.stores for m in self.stores[k].marks(part)
        )
        for kind, store in self.stores.items():
            todo = store.to_keep(parts.get(kind), cached, aligned, marks)
            if todo:
                hs = self.hashes(req, (max(p for p, _ in todo) + 1) * self.page_size)
                store.saved += self._save_to(store, [d for _, d in todo], [hs[p] for p, _ in todo])

    def _save_to(self, store: KindStore, dev: list[int], hashes: list[bytes]) -> int:
        """Copy device values `dev` of `store`'s kind into its L2 (those not there yet, as many
        as fit) and queue their L3 writes; how many were copied."""
        index = store.index
        seen: set[bytes] = set()
        todo = []
        for d, h in zip(dev, hashes, strict=True):
            if h not in seen and index.lookup(h) is None:
                seen.add(h)
                todo.append((d, h))
        n = min(len(todo), index.free_pages + index.cached_pages)
        if n == 0:
            return 0
        host_pages = index.alloc(n)
        assert host_pages is not None
        store.host.save([d for d, _ in todo[:n]], host_pages)
        for hp, (_, h) in zip(host_pages, todo, strict=False):
            index.add(h, hp)
            if self.storage is not None:
                self.storage.write(hp, h, store.kind)
        return n

    # -- loading L2 pages back (a plan the KV manager carries out) --------------------------
    def plan_load(self, req: Request, length: int, l1_full: int = 0) -> LoadPlan | None:
        """The deepest boundary past req's L1 match of `length` tokens that L1 + L2 can resume
        at (FULL pages reach it, every kind holds what it needs there), with the L2 values up to
        it, or None. The tree holds FULL K/V up to `l1_full` tokens (past `length` when a kind's
        vote cut the match short): the plan's FULL pages start there. The plan reserves its
        values (pinned) until `load`: the device memory the KV manager then allocates for it may
        evict L1 pages into L2, which must not push the planned ones out."""
        ps = self.page_size
        n_pages = (len(req.tokens) - 1) // ps
        start = length // ps
        if start >= n_pages:
            return None
        hs = self.hashes(req, n_pages * ps)
        in_l1 = min(n_pages, max(start, l1_full // ps))  # FULL pages [start, in_l1) are in L1
        touch = not self.stores  # FULL alone: the whole run is loaded (no vote)
        lookup = self.index.lookup
        run: list[int] = []
        for h in hs[in_l1:]:
            hp = lookup(h, touch)
            if hp is None:
                break
            run.append(hp)
        b = in_l1 + len(run) if touch else self._vote(hs, start, in_l1 - start + len(run))
        if b <= start:
            return None
        full_from = min(in_l1, b)
        plan = LoadPlan(_key(req), run[: b - full_from], start * ps, full_from * ps, b * ps)
        if not touch:
            for h in hs[full_from:b]:
                lookup(h)  # recency: these pages are used now
            for kind, store in self.stores.items():
                pages = list(store.needs(b, start))
                if pages:
                    plan.parts[kind] = KindPart(pages, [self._take(store, hs[p]) for p in pages])
        self._reserve(plan, True)
        return plan

    def _vote(self, hs: list[bytes], start: int, full_run: int) -> int:
        """The deepest boundary (pages) in (start, start + full_run] at which every kind holds
        all it needs, or `start`: the tree's component vote over what L2 holds."""
        for b in range(start + full_run, start, -1):
            if all(
                s.index.lookup(hs[p], touch=False) is not None
                for s in self.stores.values()
                for p in s.needs(b, start)
            ):
                return b
        return start

    @staticmethod
    def _take(store: KindStore, h: bytes) -> int:
        hp = store.index.lookup(h)
        assert hp is not None, "the vote found it held"
        return hp

    def _reserve(self, plan: LoadPlan, pin: bool) -> None:
        """Pin (or unpin) every L2 value of `plan`."""
        op = self.index.pin if pin else self.index.unpin
        for hp in plan.host_pages:
            op(hp)
        for kind, part in plan.parts.items():
            index = self.stores[kind].index
            op = index.pin if pin else index.unpin
            for hp in part.host:
                op(hp)

    def load(
        self,
        plan: LoadPlan,
        dev_pages: list[int] | None,
        units: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        """Copy the plan's values into fresh device memory: its FULL pages into `dev_pages`,
        each kind's values into `units[kind]` (in its part's order); `dev_pages` None: the KV
        manager found no room, nothing is copied. Ends the plan's reservation either way. The
        KV manager then inserts them into the tree, which reports them through `on_insert`."""
        try:
            if dev_pages is None:
                return
            self.host.load(plan.host_pages, dev_pages)
            for kind, part in plan.parts.items():
                assert units is not None, "a plan with other kinds needs their device memory"
                self.stores[kind].host.load(part.host, units[kind])
            split = self._loaded.setdefault(plan.key, [0, 0])
            for hp in plan.host_pages:
                if self.index.origin(hp) == "storage":
                    split[1] += self.page_size
                    self.counters.storage_hit_tokens += self.page_size
                    self.index.mark_origin(hp, "device")  # later reuse of this copy: an L2 hit
                else:
                    split[0] += self.page_size
                    self.counters.host_hit_tokens += self.page_size
        finally:
            self._reserve(plan, False)


def _key(req: Request) -> tuple[str, int]:
    """One choice of one request (choices share the request id, not their generated tokens)."""
    return req.request_id, int(getattr(req, "index", 0))

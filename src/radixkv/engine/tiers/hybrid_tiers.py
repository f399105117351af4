"""The host (L2) and storage (L3) tiers of a hybrid model: FULL pages as for any model, plus
the SWA pages of the window before each reusable boundary and the STATE checkpoints, all under
the same chained page hashes (a value's component is its key suffix, "<hash>-swa" and
"<hash>-state", and its storage header; every value is checksummed, `radixkv.storage.codec`).

Like `TierManager` (whose FULL side this is), the tiers are called and never call back: the KV
manager's hybrid memory (`ComponentMemory`) reports what the tree adopted (`on_components_insert`)
and what it frees (`on_evict`); `plan_load` votes over what L2 holds exactly as the tree's
components vote (`radixkv.cache.hybrid.tier_vote`) and returns a `HybridLoadPlan`; the KV manager
allocates device memory of every component for it (`radixkv.engine.kv.hybrid_load`) and `load`
copies the plan's values down.

What is kept: FULL pages by the write policy; SWA pages and checkpoints are written through when
the tree adopts them (the windows exist on the device only then: a running request frees its
SWA pages as they leave its window, and checkpoints are taken only at boundaries). The SWA pages
kept are those of the window before each boundary of `tier_boundaries` (every checkpoint
interval, page_size * 2**k, the end of each insert). Census per component L2 index after every
call: free + cached + held == its pages (`check`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from radixkv.cache.hybrid.tier_vote import deepest_boundary, tier_boundaries, window_pages_before
from radixkv.cache.tiers import HostIndex
from radixkv.engine.request import Request
from radixkv.engine.tiers.manager import MAX_PREFETCH_PAGES, LoadPlan, TierManager, _key
from radixkv.engine.tiers.prefetch import PrefetchPolicy
from radixkv.memory.host_pool import HostKVPool
from radixkv.memory.host_state import HostStatePool
from radixkv.memory.hybrid import FULL, STATE, SWA, ModelPools
from radixkv.storage import PageMeta


@dataclass
class HybridLoadPlan(LoadPlan):
    """Host values that extend one choice's L1 match of `start` tokens to `boundary` tokens:
    FULL pages (`host_pages`) for [full_from, boundary) (the tree has FULL K/V before
    `full_from`), SWA pages (token-page index, host page) of the window before `boundary` past
    `start`, the checkpoint entry at `boundary` (-1: no STATE). All pinned until
    `load_components`."""

    start: int = 0
    full_from: int = 0
    boundary: int = 0
    swa: list[tuple[int, int]] = field(default_factory=list)
    state: int = -1


class HybridTierManager(TierManager):
    def __init__(
        self,
        pools: ModelPools,
        swa_window: int | None,
        interval: int,
        page_size: int,
        host_pages: int,
        write_policy: str,
        fingerprint: str,
        storage: tuple[str, str] | None = None,
        storage_timeout_s: float = 1.0,
        prefetch: PrefetchPolicy | None = None,
    ) -> None:
        full = pools.kv(FULL)
        if full is None:
            raise ValueError("host/storage cache tiers need a model with full-attention layers")
        super().__init__(
            full,
            page_size,
            host_pages,
            write_policy,
            fingerprint,
            storage,
            storage_timeout_s,
            prefetch,
        )
        self.interval = interval
        self.window = swa_window if SWA in pools else None
        self.window_pages = -(-self.window // page_size) if self.window is not None else None
        self.swa_host: HostKVPool | None = None
        self.state_host: HostStatePool | None = None
        self.indexes: dict[str, HostIndex] = {}
        ratio = host_pages / max(1, full.num_slots // page_size)
        swa, state = pools.kv(SWA), pools.state(STATE)
        if swa is not None:
            n = max(1, round(ratio * (swa.num_slots // page_size)))
            self.swa_host = HostKVPool(swa, n, page_size)
            self.indexes[SWA] = HostIndex(n)
        if state is not None:
            n = max(1, round(ratio * state.num_slots))
            self.state_host = HostStatePool(state, n)
            self.indexes[STATE] = HostIndex(n)
        self.swa_saved_pages = self.state_saved = 0
        if self.storage is not None:
            self._add_stores(pools)

    def _add_stores(self, pools: ModelPools) -> None:
        assert self.storage is not None
        full = self.storage.worker.meta
        swa, state = pools.kv(SWA), pools.state(STATE)
        if self.swa_host is not None and swa is not None:
            meta = PageMeta(
                fingerprint=self.fingerprint,
                dtype=full.dtype,
                num_layers=swa.config.num_layers,
                page_size=self.page_size,
                shape=self.swa_host.page_shape,
                length=self.swa_host.page_bytes,
            )
            self.storage.worker.metas[SWA] = meta
            self.storage.add_store(SWA, self.indexes[SWA], self.swa_host)
        if self.state_host is not None and state is not None:
            meta = PageMeta(
                fingerprint=self.fingerprint,
                dtype=self.state_host.describe(),
                num_layers=state.num_layers,
                page_size=self.page_size,
                shape=(self.state_host.page_bytes,),
                length=self.state_host.page_bytes,
            )
            self.storage.worker.metas[STATE] = meta
            self.storage.add_store(STATE, self.indexes[STATE], self.state_host)

    # -- tree hooks (called by ComponentMemory) ------------------------------------------------
    def on_components_insert(
        self,
        req: Request,
        swa_row: np.ndarray | None,
        cached: int,
        aligned: int,
        checkpoints: list[tuple[int, int]],
    ) -> None:
        """The tree adopted req.tokens[cached:aligned] (FULL: `on_insert`) with the SWA row
        `swa_row` (slots of positions [0, aligned), -1 where freed) and the checkpoints
        (boundary, state slot) it accepted: copy the windows before the tier boundaries and
        the checkpoints to L2 (and queue them for L3)."""
        ps = self.page_size
        if self.swa_host is not None and swa_row is not None and self.window_pages is not None:
            marks = tier_boundaries(
                cached, aligned, ps, self.interval, tuple(b for b, _ in checkpoints)
            )
            pages: set[int] = set()
            for b in marks:
                pages.update(window_pages_before(b // ps, 0, self.window_pages))
            todo = sorted(p for p in pages if int(swa_row[p * ps]) >= 0)
            if todo:
                hs = self.hashes(req, (todo[-1] + 1) * ps)
                dev = [int(swa_row[p * ps]) // ps for p in todo]
                self.swa_saved_pages += self._save_to(
                    SWA, self.swa_host, dev, [hs[p] for p in todo]
                )
        if self.state_host is not None and checkpoints:
            ok = [(b, s) for b, s in checkpoints if b > 0 and b % ps == 0]
            if ok:
                hs = self.hashes(req, max(b for b, _ in ok))
                slots = [s for _, s in ok]
                self.state_saved += self._save_to(
                    STATE, self.state_host, slots, [hs[b // ps - 1] for b, _ in ok]
                )

    def _save_to(self, comp: str, host: Any, dev: list[int], hashes: list[bytes]) -> int:
        """Copy device pages/slots `dev` into component `comp`'s L2 (those not there yet, as
        many as fit) and queue their L3 writes; how many were copied."""
        index = self.indexes[comp]
        seen: set[bytes] = set()
        todo = []
        for d, h in zip(dev, hashes, strict=True):
            if h not in seen and index.lookup(h) is None:
                seen.add(h)
                todo.append((d, h))
        n = min(len(todo), index.free_pages + index.cached_pages)
        if n == 0:
            return 0
        todo = todo[:n]
        host_pages = index.alloc(n)
        assert host_pages is not None
        host.save([d for d, _ in todo], host_pages)
        for hp, (_, h) in zip(host_pages, todo, strict=True):
            index.add(h, hp)
            if self.storage is not None:
                self.storage.write(hp, h, comp)
        return n

    # -- loading (a plan the KV manager carries out) -------------------------------------------
    def _held(self, comp: str, h: bytes) -> int | None:
        index = self.indexes.get(comp)
        return None if index is None else index.lookup(h, touch=False)

    def plan_load(self, req: Request, length: int, l1_full: int = 0) -> HybridLoadPlan | None:
        """The deepest boundary past the L1 match of `length` tokens for which L1 and L2 hold
        every component (the components' vote, `radixkv.cache.hybrid.tier_vote`; the tree holds FULL
        K/V up to `l1_full` tokens, before its votes), with its L2 values pinned; None when L2
        cannot extend the match."""
        ps = self.page_size
        n_pages = (len(req.tokens) - 1) // ps
        start = length // ps
        if start >= n_pages:
            return None
        hs = self.hashes(req, n_pages * ps)
        in_l1 = min(n_pages, max(start, l1_full // ps))  # FULL pages [start, in_l1) are in L1
        run: list[int] = []
        for h in hs[in_l1:]:
            hp = self.index.lookup(h, touch=False)
            if hp is None:
                break
            run.append(hp)
        state_held = None
        if self.state_host is not None:
            state_held = lambda b: self._held(STATE, hs[b - 1]) is not None  # noqa: E731
        b = deepest_boundary(
            start,
            in_l1 - start + len(run),
            self.window_pages,
            lambda p: self._held(SWA, hs[p]) is not None,
            state_held,
        )
        if b <= start:
            return None
        full_from = min(in_l1, b)
        for h in hs[full_from:b]:
            self.index.lookup(h)  # recency: these pages are used now
        plan = HybridLoadPlan(
            _key(req),
            run[: b - full_from],
            start=start * ps,
            full_from=full_from * ps,
            boundary=b * ps,
        )
        if self.window_pages is not None:
            plan.swa = [
                (p, self._take(SWA, hs[p]))
                for p in window_pages_before(b, start, self.window_pages)
            ]
        if state_held is not None:
            plan.state = self._take(STATE, hs[b - 1])
        for hp in plan.host_pages:  # the plan's reservation, until load_components
            self.index.pin(hp)
        for _, hp in plan.swa:
            self.indexes[SWA].pin(hp)
        if plan.state >= 0:
            self.indexes[STATE].pin(plan.state)
        return plan

    def _take(self, comp: str, h: bytes) -> int:
        hp = self.indexes[comp].lookup(h)
        assert hp is not None, "the vote found it held"
        return hp

    def load_components(
        self,
        plan: HybridLoadPlan,
        full_pages: list[int] | None,
        swa_pages: list[int] | None = None,
        state_slot: int = -1,
    ) -> None:
        """Copy the plan's values into fresh device memory (FULL pages, SWA pages in the plan's
        order, a state slot; `full_pages` None: the KV manager found no room, nothing is
        copied) and end the plan's reservation."""
        try:
            self.load(plan, full_pages)  # FULL pages; ends their reservation
            if full_pages is None:
                return
            if self.swa_host is not None and plan.swa:
                assert swa_pages is not None
                self.swa_host.load([hp for _, hp in plan.swa], swa_pages)
            if self.state_host is not None and plan.state >= 0:
                self.state_host.load([plan.state], [state_slot])
        finally:
            for _, hp in plan.swa:
                self.indexes[SWA].unpin(hp)
            if plan.state >= 0:
                self.indexes[STATE].unpin(plan.state)

    # -- L3 prefetch ---------------------------------------------------------------------------
    def start_prefetch(self, req: Request, l1_tokens: int) -> float | None:
        """As for FULL pages (`TierManager.start_prefetch`), plus every SWA page and checkpoint
        of the prompt's pages past the L1 match that L2 lacks, each fetched only if the FULL run
        found reaches it (they are useless past it)."""
        if self.storage is None:
            return None
        ps = self.page_size
        n_pages = (len(req.tokens) - 1) // ps
        start = l1_tokens // ps
        hs, have, in_l2 = self._l2_run(req, l1_tokens)
        want = hs[have : have + MAX_PREFETCH_PAGES]
        extra: list[tuple[int, str, bytes]] = []
        extra_in_l2: list[tuple[str, int]] = []
        for comp in self.indexes:
            for p in range(start, min(n_pages, have + MAX_PREFETCH_PAGES)):
                hp = self._held(comp, hs[p])
                if hp is None:
                    extra.append((p + 1 - have, comp, hs[p]))
                else:
                    extra_in_l2.append((comp, hp))
        if not want and not extra:
            return None
        return self.storage.start_prefetch(
            req.request_id, want, in_l2, ps, extra, extra_in_l2, local=have > 0
        )

    # -- whole-tier operations -----------------------------------------------------------------
    def flush(self, device_reset: bool) -> None:
        super().flush(device_reset)
        for index in self.indexes.values():
            index.clear()

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        for comp, index in self.indexes.items():
            free, cached, held = index.census()
            out[f"host_{comp}_pool_pages"] = index.num_pages
            out[f"host_{comp}_free_pages"] = free
            out[f"host_{comp}_cached_pages"] = cached
            out[f"host_{comp}_held_pages"] = held
        out["host_swa_saved_pages"] = self.swa_saved_pages
        out["host_state_saved"] = self.state_saved
        return out

    def check(self) -> None:
        super().check()
        for index in self.indexes.values():
            index.check()

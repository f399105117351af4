"""Memory of the hybrid components (SWA KV, STATE) for running requests; KVManager's partner.

It holds the hybrid tree (`radixkv.cache.HybridCache`, through its `HybridPrefixCache`
contract) and makes every call that moves data in or out of it, returning what the tree lets
go of to each component's allocator.

Owners and census, per pool, after every public call (checked by `check`):
  SWA:   swa_alloc.free_slots + cache.swa_size + sum(len(r.hybrid.swa_pages)) * page_size
         == swa pool
  STATE: state_alloc.free_pages + cache.checkpoint_count
         + #running (working states) + #running snapshots == state pool
SWA: a running request owns the pages covering [swa_lo, capacity); it gets them chunk by chunk
(`ensure`) and frees those that fell out of its window (`after_step`), so a long request holds
about W tokens plus a page or two. Its table row holds -1 for positions it no longer has.
STATE: a running request owns one working slot (`state_slot`): a copy of the matched checkpoint
(copy-on-write) or, when it resumes at 0, whatever (the model starts from zeros). Checkpoints are
copies of the working slot taken right after a step that ended on a page boundary: at every
`interval` prefill tokens and at page_size * 2**k (so a shared prefix of S tokens always resumes
past S/2), at the divergence point found at admission, at the last page boundary of the prompt
(the next turn of a conversation shares the prompt even when it rewrites the answer), and at the
end of a request (exact when kv_len is page-aligned, else the last page boundary of decoding).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from radixkv.cache.base import SlotArray
from radixkv.cache.hybrid.components import Components, Freed, HybridMatch, HybridPrefixCache
from radixkv.engine.kv import hybrid_fork
from radixkv.engine.kv.hybrid_load import load_components
from radixkv.engine.request import Request
from radixkv.memory.allocator import PageAllocator
from radixkv.memory.hybrid import ModelPools, PoolSpec
from radixkv.memory.req_table import ReqToTokenTable

if TYPE_CHECKING:
    from radixkv.engine.kv.kv_manager import KVManager


class ComponentMemory:
    """SWA pages and STATE slots of running requests (see the module docstring)."""

    def __init__(
        self,
        spec: PoolSpec,
        pools: ModelPools,
        full_alloc: PageAllocator,
        page_size: int,
        swa_table: ReqToTokenTable | None,
        cache: HybridPrefixCache | None,
        interval: int,
    ) -> None:
        self.spec = spec
        self.pools = pools
        self.page_size = page_size
        self.window = spec.swa_window
        self.cache = cache  # the hybrid tree with matching Components, or None (cache off)
        self.swa_table = swa_table
        self.swa_alloc = (
            PageAllocator(pools.swa.num_slots, page_size) if pools.swa is not None else None
        )
        self.state_alloc = (
            PageAllocator(pools.state.num_slots, 1) if pools.state is not None else None
        )
        self.interval = -(-interval // page_size) * page_size
        self.full_alloc = full_alloc  # the KV manager's FULL allocator (FULL slots it frees)
        # The host/storage tiers (set by KVManager; NoTiers or a HybridTierManager): told what
        # the tree adopts (`on_components_insert`) and which FULL slots it frees (`on_evict`).
        self.tiers: Any = None
        self._swa_prefix: dict[int, SlotArray | None] = {}  # id(req) -> matched SWA, until bind

    @staticmethod
    def components_of(spec: PoolSpec) -> Components:
        """The tree's components: FULL always (real slots, or zero-layer bookkeeping slots for
        a model without FULL layers, see engine.setup.hybrid_spec)."""
        return Components(
            full=True,
            swa_window=spec.swa_window if spec.has_swa else None,
            state=spec.has_state,
        )

    # -- eviction helpers ---------------------------------------------------------------------
    def _free(self, freed: Freed) -> None:
        """Return what the tree let go of to every component's allocator (an eviction asked
        for SWA or STATE room may remove whole leaves, FULL slots included)."""
        if len(freed.full):
            if self.tiers is not None:
                self.tiers.on_evict(freed.full)  # write_back demotes before the slots are freed
            self.full_alloc.free_slots_of_pages(freed.full)
        if len(freed.swa):
            assert self.swa_alloc is not None
            self.swa_alloc.free_slots_of_pages(freed.swa)
        if freed.checkpoints:
            assert self.state_alloc is not None
            self.state_alloc.free_page_ids(list(freed.checkpoints))

    def alloc_swa(self, num_pages: int) -> list[int] | None:
        assert self.swa_alloc is not None
        pages = self.swa_alloc.alloc_pages(num_pages)
        if pages is None and self.cache is not None:
            short = num_pages - self.swa_alloc.free_pages
            self._free(self.cache.evict(swa_slots=short * self.page_size))
            pages = self.swa_alloc.alloc_pages(num_pages)
        return pages

    def alloc_state(self) -> int | None:
        assert self.state_alloc is not None
        got = self.state_alloc.alloc_pages(1)
        if got is None and self.cache is not None:
            self._free(self.cache.evict(checkpoints=1))
            got = self.state_alloc.alloc_pages(1)
        return None if got is None else got[0]

    def evict_full(self, num_tokens: int) -> None:
        """FULL pages are short: evict leaves (freeing every component they hold)."""
        if self.cache is not None:
            self._free(self.cache.evict(full_tokens=num_tokens))

    def flush(self, idle: bool) -> None:
        """Drop every unlocked cached prefix in every component (everything when idle)."""
        if self.cache is None:
            return
        if idle:
            self._free(self.cache.reset())
            return
        everything = 1 << 62
        self._free(self.cache.evict(everything, everything))
        self._free(self.cache.evict(checkpoints=everything))

    # -- admission ----------------------------------------------------------------------------
    def match(self, req: Request, query: Any, record: bool = True) -> HybridMatch:
        """The tree's match for `req` (cache on): where it resumes, and the SWA window and
        checkpoint target it needs at `bind` (`record=False`: no hit statistics)."""
        assert self.cache is not None
        m = self.cache.match(query, req.namespace, record=record)
        req.hybrid.resume_ckpt = m.checkpoint
        req.hybrid.ckpt_target = 0
        if self.spec.has_state and m.shared_length > m.length:
            req.hybrid.ckpt_target = m.shared_length
        self._swa_prefix[id(req)] = m.swa_slots
        return m

    def forget_match(self, req: Request) -> None:
        self._swa_prefix.pop(id(req), None)

    def load(
        self, kv: KVManager, req: Request, length: int, slots: np.ndarray
    ) -> tuple[int, np.ndarray]:
        """Continue a locked match from the host tier, every component voting
        (engine/kv/hybrid_load.py)."""
        return load_components(kv, self, req, length, slots)

    # -- forks (n > 1): copies of the parent's own SWA K/V and state (engine/kv/hybrid_fork.py)
    def reserve_fork(self, parent: Request) -> tuple[list[int], int] | None:
        return hybrid_fork.reserve_fork(self, parent)

    def unreserve_fork(self, held: tuple[list[int], int]) -> None:
        hybrid_fork.unreserve_fork(self, held)

    def bind_fork(self, parent: Request, child: Request, held: tuple[list[int], int]) -> None:
        hybrid_fork.bind_fork(self, parent, child, held)

    def reserve(self, req: Request) -> bool:
        """Take the working state slot before binding; False when none can be had."""
        if self.state_alloc is None:
            return True
        slot = self.alloc_state()
        if slot is None:
            return False
        req.hybrid.state_slot = slot
        return True

    def bind(self, req: Request, prefix_len: int) -> None:
        """Fill the SWA row with the match's window and the working state from the checkpoint."""
        swa_prefix = self._swa_prefix.pop(id(req), None)
        if self.swa_table is not None:
            prefix = np.full(prefix_len, -1, dtype=np.int64)
            if swa_prefix is not None and prefix_len:
                prefix[:] = np.asarray(swa_prefix[:prefix_len])
            self.swa_table.alloc_row_at(req.row)
            self.swa_table.write(req.row, 0, prefix)
        req.hybrid.swa_lo, req.hybrid.swa_pages = prefix_len, []
        if self.pools.state is not None and prefix_len > 0:
            if req.hybrid.resume_ckpt < 0:
                raise RuntimeError("resuming a STATE model past 0 without a checkpoint")
            self.pools.state.copy_state(req.hybrid.resume_ckpt, req.hybrid.state_slot)

    # -- stepping -----------------------------------------------------------------------------
    def swa_capacity(self, req: Request) -> int:
        return req.hybrid.swa_lo + len(req.hybrid.swa_pages) * self.page_size

    def ensure(self, req: Request, end: int) -> bool:
        """SWA slots for positions < end; False (nothing changed) when out of memory."""
        if self.swa_alloc is None:
            return True
        cap = self.swa_capacity(req)
        if end <= cap:
            return True
        pages = self.alloc_swa(self.swa_alloc.pages_for(end - cap))
        if pages is None:
            return False
        assert self.swa_table is not None
        self.swa_table.write(req.row, cap, self.swa_alloc.page_slots(pages))
        req.hybrid.swa_pages.extend(pages)
        return True

    def _next_power_stop(self, pos: int) -> int:
        """The first boundary page_size * 2**k strictly after `pos`."""
        stop = self.page_size
        while stop <= pos:
            stop *= 2
        return stop

    def is_checkpoint_boundary(self, req: Request, pos: int) -> bool:
        """Prefill boundaries that get a checkpoint: every `interval` tokens, every
        page_size * 2**k tokens (so a request sharing S tokens with an earlier one always
        resumes at more than half of S, even when S < interval), and the divergence point."""
        if pos <= 0 or pos % self.page_size:
            return False
        pages = pos // self.page_size
        if pos % self.interval == 0 or pages & (pages - 1) == 0 or pos == req.hybrid.ckpt_target:
            return True
        return pos == self._prompt_end(req)

    def _prompt_end(self, req: Request) -> int:
        """The last page boundary of the prompt: the next turn of a conversation shares it."""
        return req.num_prompt - req.num_prompt % self.page_size

    def chunk_cap(self, req: Request) -> int:
        """Longest prefill chunk from kv_len that does not jump over a checkpoint boundary."""
        if self.state_alloc is None:
            return req.pending
        stop = (req.kv_len // self.interval + 1) * self.interval
        stop = min(stop, self._next_power_stop(req.kv_len))
        for target in (req.hybrid.ckpt_target, self._prompt_end(req)):
            if req.kv_len < target < stop:
                stop = target
        return max(1, stop - req.kv_len)

    def after_step(self, req: Request, was_prefill: bool) -> None:
        """Free own SWA pages out of the window; snapshot the state on page boundaries."""
        ps = self.page_size
        if self.swa_alloc is not None and self.window is not None:
            keep_from = req.kv_len // ps * ps - self.window
            drop = max(0, (keep_from - req.hybrid.swa_lo) // ps) if keep_from > 0 else 0
            drop = min(drop, len(req.hybrid.swa_pages))
            if drop:
                self._drop_own_swa(req, drop, free=True)
        if self.state_alloc is not None and not was_prefill and ps > 1 and req.kv_len % ps == 0:
            if req.hybrid.snap_slot < 0:
                slot = self.state_alloc.alloc_pages(1)  # best effort: never evicts for this
                if slot is None:
                    return
                req.hybrid.snap_slot = slot[0]
            assert self.pools.state is not None
            self.pools.state.copy_state(req.hybrid.state_slot, req.hybrid.snap_slot)
            req.hybrid.snap_pos = req.kv_len

    def _drop_own_swa(self, req: Request, n: int, *, free: bool) -> None:
        """Give up the first `n` own SWA pages (freed, or already handed to the tree)."""
        assert self.swa_alloc is not None and self.swa_table is not None
        pages, req.hybrid.swa_pages = req.hybrid.swa_pages[:n], req.hybrid.swa_pages[n:]
        if free:
            self.swa_alloc.free_page_ids(pages)
        lo = req.hybrid.swa_lo
        req.hybrid.swa_lo += n * self.page_size
        self.swa_table.write(req.row, lo, np.full(req.hybrid.swa_lo - lo, -1, dtype=np.int64))

    # -- handing data to the tree --------------------------------------------------------------
    def checkpoints_for(self, req: Request, aligned: int, finishing: bool) -> list[tuple[int, int]]:
        """Checkpoints to insert with tokens[:aligned] (slots already taken from the pool)."""
        if self.state_alloc is None or aligned == 0:
            return []
        assert self.pools.state is not None
        if aligned == req.kv_len:
            due = finishing or self.is_checkpoint_boundary(req, aligned)
            if not due:
                return []
            slot = self.alloc_state()
            if slot is None:
                return []
            self.pools.state.copy_state(req.hybrid.state_slot, slot)
            return [(aligned, slot)]
        if finishing and req.hybrid.snap_slot >= 0 and 0 < req.hybrid.snap_pos <= aligned:
            slot, req.hybrid.snap_slot = req.hybrid.snap_slot, -1
            return [(req.hybrid.snap_pos, slot)]
        return []

    def swa_row(self, req: Request, aligned: int) -> np.ndarray | None:
        if self.swa_table is None:
            return None
        return self.swa_table.get_numpy(req.row, 0, aligned)

    def insert(
        self, req: Request, slots: SlotArray, aligned: int, finishing: bool
    ) -> tuple[int, Any]:
        """Hand tokens[:aligned] of every component to the tree (FULL `slots`, the SWA row,
        due checkpoints); free what it refused. Returns (already cached, handle)."""
        assert self.cache is not None
        swa_row = self.swa_row(req, aligned)
        ckpts = self.checkpoints_for(req, aligned, finishing)
        out = self.cache.insert(
            req.tokens[:aligned],
            slots,
            swa_row,
            ckpts,
            req.namespace,
            req.options.priority,
            req.prefix_len,
        )
        if self.tiers is not None:
            taken = [c for c in ckpts if c[1] not in out.checkpoints_rejected]
            self.tiers.on_components_insert(req, swa_row, out.cached, aligned, taken)
        if len(out.swa_free):
            assert self.swa_alloc is not None
            self.swa_alloc.free_slots_of_pages(out.swa_free)
        if out.checkpoints_rejected:
            assert self.state_alloc is not None
            self.state_alloc.free_page_ids(list(out.checkpoints_rejected))
        if self.swa_alloc is not None and aligned > req.hybrid.swa_lo:
            n = (aligned - req.hybrid.swa_lo) // self.page_size
            self._drop_own_swa(req, min(n, len(req.hybrid.swa_pages)), free=False)
        return out.cached, out.handle

    def rewrite_prefix(self, req: Request, handle: Any) -> None:
        """After moving the lock to `handle`: the SWA row reads the tree's slots (-1 outside
        the window)."""
        if self.swa_table is not None and self.cache is not None:
            swa = self.cache.swa_slots_of(handle)
            if swa is not None:
                self.swa_table.write(req.row, 0, swa)

    def release(self, req: Request) -> None:
        """Free everything the request still owns in every component."""
        if self.swa_alloc is not None:
            self.swa_alloc.free_page_ids(req.hybrid.swa_pages)
            req.hybrid.swa_pages = []
            assert self.swa_table is not None
            self.swa_table.free_row(req.row)
        if self.state_alloc is not None:
            slots = [s for s in (req.hybrid.state_slot, req.hybrid.snap_slot) if s >= 0]
            self.state_alloc.free_page_ids(slots)
        req.hybrid.state_slot = req.hybrid.snap_slot = -1
        req.hybrid.swa_lo = req.hybrid.snap_pos = req.hybrid.ckpt_target = 0
        req.hybrid.resume_ckpt = -1

    # -- census ---------------------------------------------------------------------------------
    def census(self, running: Sequence[Request]) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        if self.swa_alloc is not None:
            held = sum(len(r.hybrid.swa_pages) for r in running) * self.page_size
            cached = self.cache.swa_size if self.cache is not None else 0
            out["swa"] = self._row(
                self.swa_alloc.num_slots, self.swa_alloc.free_slots, cached, held
            )
        if self.state_alloc is not None:
            held = sum((r.hybrid.state_slot >= 0) + (r.hybrid.snap_slot >= 0) for r in running)
            cached = self.cache.checkpoint_count if self.cache is not None else 0
            out["state"] = self._row(
                self.state_alloc.num_pages, self.state_alloc.free_pages, cached, held
            )
        return out

    @staticmethod
    def _row(size: int, free: int, cached: int, held: int) -> dict[str, int]:
        return {"size": size, "free": free, "cached": cached, "held": held}

    def check(self, running: Sequence[Request]) -> None:
        for name, row in self.census(running).items():
            if row["free"] + row["cached"] + row["held"] != row["size"]:
                raise RuntimeError(f"{name} census broken: {row}")
        if self.swa_alloc is not None:
            self.swa_alloc.check()
            seen: set[int] = set()
            for r in running:
                for p in r.hybrid.swa_pages:
                    if p in seen or not self.swa_alloc.is_allocated(p):
                        raise RuntimeError(f"SWA page {p} of {r.request_id} is free or shared")
                    seen.add(p)
        if self.state_alloc is not None:
            self.state_alloc.check()
            owned = [
                s for r in running for s in (r.hybrid.state_slot, r.hybrid.snap_slot) if s >= 0
            ]
            if self.cache is not None:
                owned += self.cache.cached_checkpoints()
            if len(set(owned)) != len(owned) or not all(
                self.state_alloc.is_allocated(s) for s in owned
            ):
                raise RuntimeError("a STATE slot is free, or owned twice")

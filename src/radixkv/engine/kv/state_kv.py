"""STATE (recurrent / conv state) memory of running requests: one kind of `KindMemory`
(engine/kv/kind_memory.py).

Census after every call: free + tree checkpoints + #working states + #snapshots == the STATE
pool. A running request owns one working slot (`StateHold.slot`): a copy of the matched
checkpoint (copy-on-write) or, when it resumes at 0, whatever (the model starts from zeros).
Checkpoints are copies of the working slot taken right after a step that ended on a page
boundary: at every `interval` prefill tokens and at page_size * 2**k (so a shared prefix of S
tokens always resumes past S/2), at the divergence point found at admission, at the last page
boundary of the prompt (the next turn of a conversation shares the prompt even when it rewrites
the answer), and at the end of a request (exact when kv_len is page-aligned, else the last page
boundary of decoding, kept as a snapshot while decoding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from radixkv.cache.hybrid.component import ComponentSpec
from radixkv.cache.hybrid.components import HybridInsert, HybridMatch
from radixkv.cache.hybrid.state import StateComponent
from radixkv.config import EngineConfig
from radixkv.engine.kv.kind_memory import KindSetup, holding
from radixkv.engine.kv.kind_sizing import SizeContext
from radixkv.engine.request import Request
from radixkv.memory.allocator import PageAllocator
from radixkv.memory.hybrid import STATE, PoolSpec
from radixkv.memory.state_pool import StatePool


class StateSizing:
    """The STATE pool (engine/kv/kind_sizing.py): whole sequences' states, counted outside the
    byte budget. Unless --state-slots is given, 2 per running request (working state and a
    snapshot) + 32 for the tree's checkpoints; at least 2."""

    budgeted = False

    def slot_bytes(self, ctx: SizeContext) -> int:
        return ctx.spec.slot_bytes(STATE, ctx.dtype)

    def explicit(self, cfg: EngineConfig) -> int | None:
        return cfg.cache.state_num_slots

    def demand(self, ctx: SizeContext) -> int | None:
        return 2 * ctx.max_running + 32

    def settle(self, n: int, ctx: SizeContext, explicit: bool) -> int:
        if n < 2:
            raise ValueError("the STATE pool needs at least 2 slots")
        return n


@dataclass(eq=False)
class StateHold:
    """What a running request holds of the STATE pool, and what admission matched."""

    slot: int = -1  # working state, valid after kv_len tokens
    snap_slot: int = -1  # copy of the working state at snap_pos (a page boundary), or -1
    snap_pos: int = 0
    resume_ckpt: int = -1  # checkpoint matched at admission (copied into `slot` at bind)
    ckpt_target: int = 0  # divergence boundary to leave a checkpoint at (0: none)


def hold(req: Request) -> StateHold:
    """req's STATE holding (made on first use)."""
    return holding(req, STATE, StateHold)


def state_component(spec: PoolSpec) -> ComponentSpec | None:
    """The tree's STATE component (checkpoints) for a model of `spec`, if it has STATE layers."""
    return ComponentSpec(StateComponent) if STATE in spec else None


def _owned(req: Request) -> list[int]:
    h = req.kv_kinds.get(STATE)
    return [] if h is None else [s for s in (h.slot, h.snap_slot) if s >= 0]


class StateMemory:
    kind = STATE

    def __init__(self, pool: StatePool, setup: KindSetup) -> None:
        self.pool = pool
        self.page_size = setup.page_size
        self.interval = setup.interval
        self.alloc_ = PageAllocator(pool.num_slots, 1)
        self.cache = setup.cache
        self._evict = setup.evict

    # -- allocation ----------------------------------------------------------------------------
    def alloc_slot(self) -> int | None:
        """One state slot, evicting a checkpoint of the tree when short; None if impossible."""
        got = self.alloc_.alloc_pages(1)
        if got is None and self.cache is not None:
            self._evict(STATE, 1)
            got = self.alloc_.alloc_pages(1)
        return None if got is None else got[0]

    def free_slots(self, slots: list[int]) -> None:
        self.alloc_.free_page_ids(slots)

    def take_freed(self, ckpts: tuple[int, ...] | None) -> None:
        """Checkpoints the tree let go of, or refused."""
        if ckpts:
            self.alloc_.free_page_ids(list(ckpts))

    # -- admission -----------------------------------------------------------------------------
    def on_match(self, req: Request, m: HybridMatch) -> None:
        h = hold(req)
        h.resume_ckpt = m.kinds.get(STATE, -1)
        h.ckpt_target = m.shared_length if m.shared_length > m.length else 0

    def forget_match(self, req: Request) -> None:
        return None

    def reserve(self, req: Request) -> bool:
        """The working state slot, taken before binding."""
        slot = self.alloc_slot()
        if slot is None:
            return False
        hold(req).slot = slot
        return True

    def unreserve(self, req: Request) -> None:
        h = hold(req)
        if h.slot >= 0:
            self.alloc_.free_page_ids([h.slot])
            h.slot = -1

    def bind(self, req: Request, prefix_len: int) -> None:
        """The working state starts as a copy of the matched checkpoint."""
        h = hold(req)
        if prefix_len > 0:
            if h.resume_ckpt < 0:
                raise RuntimeError("resuming a STATE model past 0 without a checkpoint")
            self.pool.copy_state(h.resume_ckpt, h.slot)

    # -- stepping ------------------------------------------------------------------------------
    def ensure(self, req: Request, end: int) -> bool:
        return True

    def _next_power_stop(self, pos: int) -> int:
        """The first boundary page_size * 2**k strictly after `pos`."""
        stop = self.page_size
        while stop <= pos:
            stop *= 2
        return stop

    def is_checkpoint_boundary(self, req: Request, pos: int) -> bool:
        """Prefill boundaries that get a checkpoint: every `interval` tokens, every
        page_size * 2**k tokens, the divergence point and the prompt's last page boundary."""
        if pos <= 0 or pos % self.page_size:
            return False
        pages = pos // self.page_size
        if pos % self.interval == 0 or pages & (pages - 1) == 0 or pos == hold(req).ckpt_target:
            return True
        return pos == self._prompt_end(req)

    def _prompt_end(self, req: Request) -> int:
        """The last page boundary of the prompt: the next turn of a conversation shares it."""
        return req.num_prompt - req.num_prompt % self.page_size

    def chunk_cap(self, req: Request) -> int | None:
        """Longest prefill chunk from kv_len that does not jump over a checkpoint boundary."""
        stop = (req.kv_len // self.interval + 1) * self.interval
        stop = min(stop, self._next_power_stop(req.kv_len))
        for target in (hold(req).ckpt_target, self._prompt_end(req)):
            if req.kv_len < target < stop:
                stop = target
        return max(1, stop - req.kv_len)

    def after_step(self, req: Request, was_prefill: bool) -> None:
        """Decoding: snapshot the working state on page boundaries (best effort)."""
        ps = self.page_size
        if was_prefill or ps <= 1 or req.kv_len % ps:
            return
        h = hold(req)
        if h.snap_slot < 0:
            slot = self.alloc_.alloc_pages(1)  # best effort: never evicts for this
            if slot is None:
                return
            h.snap_slot = slot[0]
        self.pool.copy_state(h.slot, h.snap_slot)
        h.snap_pos = req.kv_len

    def batch_slots(self, reqs: Sequence[Request], rows: list[int], ends: list[int]) -> list[int]:
        return [hold(r).slot for r in reqs]

    # -- the tree ------------------------------------------------------------------------------
    def tree_part(self, req: Request, aligned: int, finishing: bool) -> list[tuple[int, int]]:
        """Checkpoints (boundary, slot) to insert with tokens[:aligned] (slots already taken)."""
        if aligned == 0:
            return []
        h = hold(req)
        if aligned == req.kv_len:
            if not (finishing or self.is_checkpoint_boundary(req, aligned)):
                return []
            slot = self.alloc_slot()
            if slot is None:
                return []
            self.pool.copy_state(h.slot, slot)
            return [(aligned, slot)]
        if finishing and h.snap_slot >= 0 and 0 < h.snap_pos <= aligned:
            slot, h.snap_slot = h.snap_slot, -1
            return [(h.snap_pos, slot)]
        return []

    def after_insert(self, req: Request, part: Any, out: HybridInsert, aligned: int) -> None:
        self.take_freed(out.refused.get(STATE))

    def rewrite_prefix(self, req: Request, handle: Any) -> None:
        return None

    # -- tier loads (TierKind) -----------------------------------------------------------------
    def tier_part(self, part: Any, out: HybridInsert) -> list[tuple[int, int]]:
        """The checkpoints the tree accepted."""
        refused = out.refused.get(STATE, ())
        return [c for c in part if c[1] not in refused]

    def load_alloc(self, n: int) -> list[int] | None:
        got: list[int] = []
        for _ in range(n):
            slot = self.alloc_slot()
            if slot is None:
                self.free_slots(got)
                return None
            got.append(slot)
        return got

    def load_free(self, units: list[int]) -> None:
        self.free_slots(units)

    def loaded_part(
        self, pages: list[int], units: list[int], boundary: int
    ) -> list[tuple[int, int]]:
        """Checkpoints (boundary tokens, slot): a checkpoint is kept under the page it ends."""
        return [((p + 1) * self.page_size, s) for p, s in zip(pages, units, strict=True)]

    # -- forks -----------------------------------------------------------------------------------
    def reserve_fork(self, parent: Request) -> int | None:
        return self.alloc_slot()

    def unreserve_fork(self, held: int) -> None:
        self.alloc_.free_page_ids([held])

    def bind_fork(self, parent: Request, child: Request, held: int) -> None:
        """The child's working state is a copy of the parent's (after the whole prompt)."""
        h = hold(child)
        h.slot, h.resume_ckpt, h.ckpt_target = held, -1, 0
        self.pool.copy_state(hold(parent).slot, held)

    # -- the end, and the books ------------------------------------------------------------------
    def release(self, req: Request) -> None:
        self.alloc_.free_page_ids(_owned(req))
        req.kv_kinds.pop(STATE, None)

    def census(self, running: Sequence[Request]) -> dict[str, int]:
        return {
            "size": self.alloc_.num_pages,
            "free": self.alloc_.free_pages,
            "cached": self.cache.held(STATE) if self.cache is not None else 0,
            "held": sum(len(_owned(r)) for r in running),
        }

    def check(self, running: Sequence[Request]) -> None:
        self.alloc_.check()
        owned = [s for r in running for s in _owned(r)]
        if self.cache is not None:
            owned += self.cache.held_values(STATE)
        if len(set(owned)) != len(owned) or not all(self.alloc_.is_allocated(s) for s in owned):
            raise RuntimeError("a STATE slot is free, or owned twice")

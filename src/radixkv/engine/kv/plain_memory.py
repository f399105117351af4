"""`PlainMemory`: the tree-side memory of a model with FULL attention layers only.

The KV manager (engine/kv/kv_manager.py) talks to one tree-side memory through one set of calls,
whatever the model: `PlainMemory` here, or `ComponentMemory` (engine/kv/components_kv.py) for a
hybrid model, whose tree also holds SWA windows and STATE checkpoints. Tree-level calls (match,
insert, evict, flush, the tiers' loads, forks) go to the tree this object holds; per-request
hooks (reserve, bind, ensure, ...) do nothing here: a FULL-only request owns nothing but the FULL
pages and table row the KV manager gives it.

Every slot this frees goes back to the KV manager's allocator, after the tiers (write-back
demotes before the slots are freed) and the KV events (`removed`, `cleared`) are told.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from radixkv.cache.base import MatchResult, PrefixCache, SlotArray
from radixkv.engine.events.kv_events import EventSink
from radixkv.engine.kv.kind_memory import TierKind
from radixkv.engine.request import Request
from radixkv.engine.tiers.kind_store import KindPart
from radixkv.memory.allocator import PageAllocator

if TYPE_CHECKING:
    from radixkv.engine.kv.kv_manager import KVManager
    from radixkv.engine.tiers.tier_setup import Tiers


_NO_SLOTS = np.empty(0, dtype=np.int64)


class PlainMemory:
    """A FULL-only prefix cache (`cache`, None when the cache is off) behind the calls the KV
    manager makes of every tree-side memory. `spec` is None: no hybrid pools."""

    spec: Any = None

    def __init__(
        self, cache: PrefixCache | None, allocator: PageAllocator, events: EventSink
    ) -> None:
        self.cache = cache
        self.allocator = allocator
        self.events = events
        self.tiers: Tiers | Any = None  # set by the KV manager

    # -- tree-level calls -------------------------------------------------------------------
    def match(self, req: Request, query: Any) -> MatchResult:
        assert self.cache is not None
        return self.cache.match(query, req.namespace)

    def insert(
        self, req: Request, slots: SlotArray, aligned: int, finishing: bool
    ) -> tuple[int, Any]:
        """Hand tokens[:aligned] with their FULL `slots` to the tree; (already cached, handle)."""
        assert self.cache is not None
        return self.cache.insert(
            req.tokens[:aligned], slots, req.namespace, priority=req.options.priority
        )

    def evict_full(self, num_tokens: int) -> None:
        """FULL pages are short: evict unlocked leaves and free their slots."""
        if self.cache is None:
            return
        self._free(self.cache.evict(num_tokens))

    def flush(self, idle: bool) -> None:
        """Drop every unlocked cached prefix (everything, and the tree reset, when idle)."""
        if self.cache is None:
            return
        if idle:
            self.allocator.free_slots_of_pages(self.cache.reset())
            self.events.cleared()  # KV events hook
            return
        self._free(self.cache.evict(self.cache.evictable_size), demote=False)

    def _free(self, evicted: np.ndarray, demote: bool = True) -> None:
        self.tiers.on_evict(evicted, demote=demote)  # write_back demotes before the slots go
        self.events.removed(evicted)  # KV events hook
        self.allocator.free_slots_of_pages(evicted)

    # -- tier loads (engine/kv/tier_load.py): FULL pages alone, the match is all the tree has --
    def peek_full(self, req: Request, length: int) -> tuple[int, np.ndarray, Any]:
        """(tokens of FULL K/V the tree holds, their slots, a guard): the locked match."""
        return length, _NO_SLOTS, None

    def end_peek(self, guard: Any) -> None:
        return None

    def tier_kind(self, kind: str) -> TierKind:
        raise KeyError(f"a FULL-only model has no KV of kind {kind!r}")

    def insert_loaded(
        self,
        req: Request,
        boundary: int,
        full: np.ndarray,
        parts: Mapping[str, KindPart],
        units: Mapping[str, list[int]],
        length: int,
    ) -> tuple[int, Any]:
        """Hand the loaded tokens[:boundary] (FULL slots `full`) to the tree; (cached,
        handle). The locked prefix is exactly what the tree has (single-threaded)."""
        assert self.cache is not None
        cached, handle = self.cache.insert(
            req.tokens[:boundary], full, req.namespace, priority=req.options.priority
        )
        if cached != length:
            raise RuntimeError(f"tier load: tree had {cached} tokens, expected {length}")
        return cached, handle

    def resume_loaded(
        self, kv: KVManager, req: Request, handle: Any, boundary: int, full: np.ndarray
    ) -> tuple[int, np.ndarray]:
        """Move req's lock onto the loaded prefix (the tree adopted all of `full`)."""
        assert self.cache is not None
        self.cache.lock(handle)
        kv.unlock(req)
        req.handle = handle
        return boundary, full

    # -- forks: nothing besides the FULL row and pages the KV manager gives the child --------
    def reserve_fork(self, parent: Request) -> dict[str, Any] | None:
        return {}

    def unreserve_fork(self, held: dict[str, Any]) -> None:
        return None

    def bind_fork(self, parent: Request, child: Request, held: dict[str, Any]) -> None:
        return None

    # -- per-request hooks: a FULL-only request owns nothing here ----------------------------
    def reserve(self, req: Request) -> bool:
        return True

    def forget_match(self, req: Request) -> None:
        return None

    def bind(self, req: Request, prefix_len: int) -> None:
        return None

    def ensure(self, req: Request, end: int) -> bool:
        return True

    def chunk_cap(self, req: Request) -> int:
        return req.pending

    def after_step(self, req: Request, was_prefill: bool) -> None:
        return None

    def rewrite_prefix(self, req: Request, handle: Any) -> None:
        return None

    def release(self, req: Request) -> None:
        return None

    def census(self, running: Sequence[Request]) -> dict[str, dict[str, int]]:
        return {}

    def check(self, running: Sequence[Request]) -> None:
        return None

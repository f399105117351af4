"""The prefix-cache contract shared by every cache design (radix tree, block hash).

Metadata only: keys are token ids, values are KV slot indices (numpy int arrays). Nothing under
`radixkv.cache` imports torch or frees memory; the caller owns freeing the slots a call returns.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

SlotArray = npt.NDArray[np.int64]
Namespace = Hashable | None


@dataclass(frozen=True)
class MatchResult:
    """The longest cached prefix of a query, floored to whole pages.

    `slots[i]` holds the KV of token i of the query, for i < length. `handle` is opaque; pass it to
    `lock`/`unlock` to protect exactly the matched prefix.
    """

    length: int
    slots: SlotArray
    handle: Any
    # Hybrid caches only (see radixkv.cache.components); defaults for the FULL-only cache.
    # `swa_slots[i]` is the SWA slot of token i for i in [length - W, length), -1 before that.
    swa_slots: SlotArray | None = None
    # The STATE checkpoint id valid exactly at `length` (-1: none; resume from zeros at 0).
    checkpoint: int = -1
    # Longest page-aligned prefix whose tokens are on a cached path, before the SWA and STATE
    # votes; `shared_length > length` means the request diverges at `shared_length` inside
    # a span it cannot resume in (a good place for a new checkpoint). -1 when not computed.
    shared_length: int = -1


@dataclass(frozen=True)
class CacheStats:
    """Cumulative accounting, in tokens (request hit rates alone mislead)."""

    matched_tokens: int
    requested_tokens: int
    inserted_tokens: int
    evicted_tokens: int
    match_calls: int
    insert_calls: int

    @property
    def hit_rate(self) -> float:
        return self.matched_tokens / self.requested_tokens if self.requested_tokens else 0.0


class PrefixCache(Protocol):
    """What the scheduler needs from a prefix cache. See DESIGN.md, "The cache contract"."""

    page_size: int

    def match(
        self, tokens: Sequence[int], namespace: Namespace = None, *, record: bool = True
    ) -> MatchResult:
        """Longest cached prefix. `record=False` is a peek (schedulers probing for LPM order):
        it touches neither the hit statistics nor the eviction recency."""
        ...

    def insert(
        self,
        tokens: Sequence[int],
        slots: Sequence[int] | SlotArray,
        namespace: Namespace = None,
        priority: int = 0,
    ) -> int: ...

    def lock(self, handle: Any) -> None: ...

    def unlock(self, handle: Any) -> None: ...

    def evict(self, num_tokens: int) -> SlotArray: ...

    @property
    def evictable_size(self) -> int: ...

    @property
    def protected_size(self) -> int: ...

    @property
    def total_size(self) -> int: ...

    def stats(self) -> CacheStats: ...

    def reset(self) -> SlotArray:
        """Drop every node (locks included) and return all slots the cache held, for the caller
        to free."""
        ...

    def cached_slots(self) -> SlotArray:
        """Every slot the cache currently holds (census: free + cached + held == pool)."""
        ...

    def check_integrity(self) -> None: ...

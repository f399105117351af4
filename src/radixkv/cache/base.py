"""The prefix-cache contracts: `PrefixIndex` (lookup, locks, sizes, checks: every design, the
hybrid tree included) and `PrefixCache` (plus the FULL-only insert / evict / reset that the radix
tree and the block-hash peer share). The hybrid tree's own contract is in `components`.

Metadata only: keys are token ids, values are KV slot indices (numpy int arrays). Nothing under
`radixkv.cache` imports torch or frees memory; the caller owns freeing the slots a call returns.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

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


class InsertResult(NamedTuple):
    """What `insert` did: `cached` leading tokens were already in the tree (a whole number of
    pages), and `handle` covers exactly the page-floored inserted prefix (None when that is
    empty), ready to `lock`: no match needed after an insert."""

    cached: int
    handle: Any


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


class PrefixIndex(Protocol):
    """What every prefix cache offers, whatever the components it holds: lookup, locks, sizes
    (FULL tokens), statistics and checks. The scheduler and the engine's accounting need no
    more; what goes in and comes out of the cache is each design's own contract."""

    page_size: int

    def match(
        self, tokens: Sequence[int], namespace: Namespace = None, *, record: bool = True
    ) -> MatchResult:
        """Longest cached prefix. `record=False` is a peek (schedulers probing for LPM order):
        it touches neither the hit statistics nor the eviction recency."""
        ...

    def lock(self, handle: Any) -> None: ...

    def unlock(self, handle: Any) -> None: ...

    def slots_of(self, handle: Any) -> SlotArray:
        """The FULL slots of the prefix `handle` covers, in token order (a fresh array)."""
        ...

    @property
    def evictable_size(self) -> int: ...

    @property
    def protected_size(self) -> int: ...

    @property
    def total_size(self) -> int: ...

    def stats(self) -> CacheStats: ...

    def cached_slots(self) -> SlotArray:
        """Every FULL slot the cache currently holds (census: free + cached + held == pool)."""
        ...

    def check_integrity(self) -> None: ...


class PrefixCache(PrefixIndex, Protocol):
    """A FULL-only prefix cache (radix tree, block hash). See DESIGN.md, "The cache contract"."""

    def insert(
        self,
        tokens: Sequence[int],
        slots: Sequence[int] | SlotArray,
        namespace: Namespace = None,
        priority: int = 0,
    ) -> InsertResult: ...

    def evict(self, num_tokens: int) -> SlotArray: ...

    def reset(self) -> SlotArray:
        """Drop every node (locks included) and return all slots the cache held, for the caller
        to free."""
        ...

"""Memory components of a hybrid model, as the radix tree sees them, and the hybrid cache's
contract (`HybridPrefixCache`, its match, insert and eviction results, each carrying one value
per kind); metadata only, no torch.

A model's layers fall into kinds of KV, each with its own pool and its own reuse rule at a
candidate boundary B (a page boundary on a cached path). FULL (K/V for every token, every
boundary on the cached path usable, evicted leaf-first) is the tree core's own `slots`. Every
other kind the tree keeps is one `TreeComponent` (`component.py`), built from a `ComponentSpec`:

- SWA(window W), `swa.py`: K/V for every token, but a boundary is usable only if the W tokens
  before it still have their K/V; K/V further back may be freed (tombstones, slot -1).
- STATE, `state.py`: a fixed-size recurrent/conv state. Accepts B = 0 and boundaries that carry
  a checkpoint (a state slot holding the state after exactly B tokens).

`Components` says which of them a cache was built with (the engine's registry of kinds,
engine/kv/kinds.py, answers the specs for a model). The plain full-attention cache
(`RadixCache`) is the FULL-only case; every other combination is a `HybridCache`
(`radixkv.cache.hybrid.cache`), built on the same tree core.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from radixkv.cache.base import MatchResult, PrefixIndex, SlotArray
from radixkv.cache.hybrid.component import ComponentSpec

FULL = "full"  # the core's own kind: one slot per token on every node
TOMBSTONE = -1  # an SWA slot entry whose K/V was freed (or never kept)


@dataclass(frozen=True)
class Components:
    """Which components a cache tracks: FULL, and the tree's other kinds in the tree's order,
    each a `ComponentSpec` (its class and argument). At least one of them must carry per-token
    data (FULL or SWA, `HybridCache` checks the kinds). The engine builds it from its registry
    of kinds; by hand, `names.parse_components(["full", "swa:4096", "state"])`."""

    full: bool = True
    parts: tuple[ComponentSpec, ...] = ()

    def __post_init__(self) -> None:
        if not self.full and not self.parts:
            raise ValueError("a cache needs a FULL component or another one")
        names = self.kinds
        if len(set(names)) != len(names) or FULL in names:
            raise ValueError(f"a kind named twice: {names}")

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds besides FULL, in the tree's order."""
        return tuple(p.kind for p in self.parts)

    @property
    def hybrid(self) -> bool:
        """True unless this is the plain FULL-only cache."""
        return not self.full or bool(self.parts)

    def has(self, kind: str) -> bool:
        return kind in self.kinds

    def get(self, kind: str) -> int | None:
        """The argument of `kind` (None: no argument, or no such kind)."""
        return next((p.arg for p in self.parts if p.kind == kind), None)

    def names(self) -> tuple[str, ...]:
        return ((FULL,) if self.full else ()) + tuple(p.name for p in self.parts)


def _empty() -> SlotArray:
    return np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class Freed:
    """What one eviction (or reset) took from the tree: FULL slots, and per kind its value
    (SWA: a slot array; STATE: a tuple of checkpoint ids); the caller frees them."""

    full: SlotArray = field(default_factory=_empty)
    kinds: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HybridMatch(MatchResult):
    """A hybrid match: the deepest boundary every component accepts, with each one's data.

    `kinds[kind]` is what the match gives that kind (`TreeComponent.matched`): SWA the slots
    of tokens [length - W, length), -1 before that; STATE the checkpoint valid exactly at
    `length` (-1: none; resume from zeros at 0). `shared_length` is the longest page-aligned
    prefix whose tokens are on a cached path, before the components' votes: `shared_length >
    length` means the request diverges at `shared_length` inside a span it cannot resume in (a
    good place for a new checkpoint).
    """

    kinds: Mapping[str, Any] = field(default_factory=dict)
    shared_length: int = -1


class HybridInsert(NamedTuple):
    """Result of `HybridCache.insert`.

    `cached`: leading tokens already cached (FULL semantics, as the plain insert returns);
    `handle`: covers exactly the page-floored inserted prefix (None when that is empty).
    `refused[kind]`: what the tree did not take of that kind's part; the caller frees it. SWA:
    the caller's slots (from positions >= owned_from) the tree already had (adopted ones, a new
    tail or revived tombstones, are the tree's now); STATE: checkpoint ids it did not take (one
    was already there, or the boundary is invalid).
    """

    cached: int
    handle: Any
    refused: Mapping[str, Any]


class HybridPrefixCache(PrefixIndex, Protocol):
    """What the engine needs from a cache of several components (the FULL sizes and
    `cached_slots` of `PrefixIndex` count FULL tokens; every other kind has its own, `held`)."""

    components: Components

    def match(
        self, tokens: Sequence[int], namespace: Hashable | None = None, *, record: bool = True
    ) -> HybridMatch: ...

    def insert(
        self,
        tokens: Sequence[int],
        slots: Sequence[int] | SlotArray | None,
        parts: Mapping[str, Any] | None = None,
        namespace: Hashable | None = None,
        priority: int = 0,
        owned_from: int = 0,
    ) -> HybridInsert: ...

    def evict(self, want: Mapping[str, int]) -> Freed:
        """Free at least `want[kind]` of each kind where possible (FULL tokens, SWA slots,
        checkpoints)."""
        ...

    def reset(self) -> Freed: ...

    def peek_full(
        self, tokens: Sequence[int], namespace: Hashable | None = None
    ) -> tuple[int, SlotArray, Any]:
        """The cached path before the votes: (length, FULL slots, a handle protecting them)."""
        ...

    def part_of(self, kind: str, handle: Any) -> Any:
        """What a match of exactly the prefix `handle` covers gives `kind` (None without it)."""
        ...

    def held(self, kind: str) -> int:
        """Units of `kind` the tree holds (SWA slots, checkpoints; 0 without it)."""
        ...

    def held_values(self, kind: str) -> list[int]:
        """The values of `kind` the tree holds (its slots or checkpoint ids)."""
        ...

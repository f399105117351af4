"""Memory components of a hybrid model, as the radix tree sees them, and the hybrid cache's
contract (`HybridPrefixCache`, its match and insert results); metadata only, no torch.

A model's layers fall into up to three components, each with its own pool and its own reuse rule
at a candidate boundary B (a page boundary on a cached path):

- FULL: K/V for every token. Accepts every boundary on the cached path. Evicted leaf-first.
- SWA(window W): K/V for every token, but a boundary is usable only if the W tokens before it
  still have their K/V; K/V further back may be freed, leaving tombstones (slot -1) on the node.
- STATE: a fixed-size recurrent/conv state. Accepts B = 0 and boundaries that carry a checkpoint
  (a state slot holding the state after exactly B tokens); cached checkpoints are never written.

`Components` says which of them a cache was built with. The plain full-attention cache
(`RadixCache`) is the FULL-only case; every other combination is a `HybridCache`
(`radixkv.cache.hybrid.cache`), built on the same tree core.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from radixkv.cache.base import MatchResult, PrefixIndex, SlotArray

TOMBSTONE = -1  # an SWA slot entry whose K/V was freed (or never kept)


@dataclass(frozen=True)
class Components:
    """Which components a cache tracks. At least FULL or SWA must be present (they carry the
    per-token data that keeps a path alive); STATE rides on top of either."""

    full: bool = True
    swa_window: int | None = None
    state: bool = False

    def __post_init__(self) -> None:
        if self.swa_window is not None and self.swa_window < 1:
            raise ValueError(f"swa_window must be >= 1, got {self.swa_window}")
        if not self.full and self.swa_window is None:
            raise ValueError("a cache needs a FULL or an SWA component")

    @property
    def has_swa(self) -> bool:
        return self.swa_window is not None

    @property
    def hybrid(self) -> bool:
        """True unless this is the plain FULL-only cache."""
        return not self.full or self.swa_window is not None or self.state

    @classmethod
    def parse(cls, spec: Components | Iterable[str] | None) -> Components:
        """`None` → FULL only; or names such as ("full", "swa:4096", "state")."""
        if spec is None:
            return cls()
        if isinstance(spec, Components):
            return spec
        full = state = False
        window: int | None = None
        for item in spec:
            name, _, arg = str(item).partition(":")
            if name == "full":
                full = True
            elif name == "swa":
                if not arg:
                    raise ValueError("swa needs a window, e.g. 'swa:4096'")
                window = int(arg)
            elif name == "state":
                state = True
            else:
                raise ValueError(f"unknown component {item!r} (full | swa:W | state)")
        return cls(full=full, swa_window=window, state=state)

    def names(self) -> tuple[str, ...]:
        out = []
        if self.full:
            out.append("full")
        if self.swa_window is not None:
            out.append(f"swa:{self.swa_window}")
        if self.state:
            out.append("state")
        return tuple(out)


def _empty() -> SlotArray:
    return np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class Freed:
    """What one eviction (or reset) took from the tree, per component; the caller frees it."""

    full: SlotArray = field(default_factory=_empty)
    swa: SlotArray = field(default_factory=_empty)
    checkpoints: tuple[int, ...] = ()


@dataclass(frozen=True)
class HybridMatch(MatchResult):
    """A hybrid match: the deepest boundary every component accepts, with each one's data.

    `swa_slots[i]` is the SWA slot of token i for i in [length - W, length), -1 before that
    (None without SWA). `checkpoint` is the STATE checkpoint valid exactly at `length` (-1:
    none; resume from zeros at 0). `shared_length` is the longest page-aligned prefix whose
    tokens are on a cached path, before the SWA and STATE votes: `shared_length > length`
    means the request diverges at `shared_length` inside a span it cannot resume in (a good
    place for a new checkpoint).
    """

    swa_slots: SlotArray | None = None
    checkpoint: int = -1
    shared_length: int = -1


class HybridInsert(NamedTuple):
    """Result of `HybridCache.insert`.

    `cached`: leading tokens already cached (FULL semantics, as the plain insert returns);
    `handle`: covers exactly the page-floored inserted prefix (None when that is empty).
    `swa_free`: the caller's SWA slots (from positions >= owned_from) the tree did not adopt
    (duplicates); the caller frees them. Adopted ones (new tail, revived tombstones) are the
    tree's now. `checkpoints_rejected`: checkpoint ids the tree did not take (a checkpoint was
    already there, or the boundary is invalid); the caller frees them.
    """

    cached: int
    handle: Any
    swa_free: SlotArray
    checkpoints_rejected: tuple[int, ...]


class HybridPrefixCache(PrefixIndex, Protocol):
    """What the engine needs from a cache of several components (the FULL sizes and
    `cached_slots` of `PrefixIndex` count FULL tokens; SWA and STATE have their own)."""

    components: Components

    def match(
        self, tokens: Sequence[int], namespace: Hashable | None = None, *, record: bool = True
    ) -> HybridMatch: ...

    def insert(
        self,
        tokens: Sequence[int],
        slots: Sequence[int] | SlotArray | None,
        swa: Sequence[int] | SlotArray | None = None,
        checkpoints: Sequence[tuple[int, int]] = (),
        namespace: Hashable | None = None,
        priority: int = 0,
        owned_from: int = 0,
    ) -> HybridInsert: ...

    def evict(self, full_tokens: int = 0, swa_slots: int = 0, checkpoints: int = 0) -> Freed: ...

    def reset(self) -> Freed: ...

    def peek_full(
        self, tokens: Sequence[int], namespace: Hashable | None = None
    ) -> tuple[int, SlotArray, Any]:
        """The cached path before the votes: (length, FULL slots, a handle protecting them)."""
        ...

    def swa_slots_of(self, handle: Any) -> SlotArray | None:
        """The SWA slots of the prefix `handle` covers, -1 before its window (None without
        SWA)."""
        ...

    @property
    def swa_size(self) -> int: ...

    @property
    def checkpoint_count(self) -> int: ...

    def cached_checkpoints(self) -> list[int]: ...

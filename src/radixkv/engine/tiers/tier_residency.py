"""What the lower tiers hold, told as KV events: L2 (host memory, medium "CPU") and L3 (storage,
medium "DISK"), beside the device pool's "GPU" blocks.

A router that keys blocks by (replica, medium), as vLLM's offloading connector announces them and
llm-d's indexer tracks them, then sees that a replica can serve a prefix from host memory or its
store although the device pool dropped it.

The tiers only *record* (`TierResidency`); the KV manager drains the record once per step into
the event sink (`residency_ops`), so the tiers still call nothing back. What is announced:
- "CPU" stored when a page enters L2 (copied down from the device, or fetched from L3), removed
  when L2 drops it;
- "DISK" stored when this replica learns a page is in L3 (its write was confirmed, or its fetch
  found it). L3 is shared and evicts on its own, so "DISK" blocks are never removed (only an
  AllBlocksCleared, at a flush or a restart, retracts them).

The block id of a page is the tiers' own chained page hash, so these events agree with the
"GPU" ones only when a block is one page (`block_size` = `--page-size`); with larger blocks only
the device pool is announced. A stored event carries the page's tokens and its parent's id,
remembered from when the tiers hashed the page, in a registry bounded to about twice the pages
of both pools (LRU by hashing); a page no longer in it is not announced and is counted
(`unknown`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

MEDIUM_HOST = "CPU"  # vLLM's names for the offload tiers
MEDIUM_STORAGE = "DISK"


@dataclass(frozen=True)
class PageInfo:
    """What a stored event needs of a page besides its hash."""

    parent: bytes | None  # the previous page's hash (None: the sequence's first page)
    tokens: np.ndarray  # the page's token ids
    namespace: Hashable | None  # the cache salt


@dataclass(frozen=True)
class TierOp:
    """One residency change: `stored` (with `info`) or removed, of page `h` in `medium`."""

    stored: bool
    medium: str
    h: bytes
    info: PageInfo | None = None


class TierResidency:
    """The tiers' record of residency changes since the last drain."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(capacity, 1)
        self._info: OrderedDict[bytes, PageInfo] = OrderedDict()  # LRU, at most `capacity`
        self._ops: list[TierOp] = []
        self.unknown = 0  # stored pages whose tokens were no longer known (not announced)

    def note_chain(
        self, tokens: Any, hashes: Sequence[bytes], start: int, page_size: int, ns: Hashable | None
    ) -> None:
        """Remember pages [start, len(hashes)) of a chain just hashed over `tokens`."""
        info = self._info
        for i in range(start, len(hashes)):
            h = hashes[i]
            if h in info:
                info.move_to_end(h)
                continue
            page = np.asarray(tokens[i * page_size : (i + 1) * page_size], dtype=np.int64)
            info[h] = PageInfo(hashes[i - 1] if i else None, page, ns)
        while len(info) > self.capacity:
            info.popitem(last=False)

    def stored(self, medium: str, h: bytes) -> None:
        got = self._info.get(h)
        if got is None:
            self.unknown += 1
            return
        self._ops.append(TierOp(True, medium, h, got))

    def removed(self, medium: str, h: bytes) -> None:
        self._ops.append(TierOp(False, medium, h))

    def drain(self) -> list[TierOp]:
        ops, self._ops = self._ops, []
        return ops

    def take_journals(
        self, host: list[tuple[bool, bytes]] | None, storage: list[bytes] | None
    ) -> list[TierOp]:
        """Record the L2 index's journal (added or removed, hash) and the L3 tier's (hashes
        confirmed stored), emptying both, then drain: the changes since the last call."""
        for added, h in host or ():
            (self.stored if added else self.removed)(MEDIUM_HOST, h)
        for h in storage or ():
            self.stored(MEDIUM_STORAGE, h)
        if host:
            host.clear()
        if storage:
            storage.clear()
        return self.drain()

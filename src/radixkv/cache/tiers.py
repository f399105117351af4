"""Tier metadata beside the tree: chained page hashes and the host (L2) page index.

Metadata only (no torch): the host pool's tensors live in `radixkv.memory.host_pool`, the storage
backends in `radixkv.storage`. The tiers are indexed by *chained page hashes*, not by tree nodes,
so the radix tree needs no per-node tier state (see docs/server.md, "Hierarchical cache"):

    h_0 = H(namespace);  h_i = H(h_{i-1} || tokens of page i)   (blake2b, 16 bytes)

The namespace is the model fingerprint plus the request's cache salt, so two models or two
tenants never produce the same key for the same tokens, including keys that leave the process.

HostIndex census, after every public call: free + cached + held == num_pages, where
- free: on the free list, in no map;
- cached: in the hash map, pin count 0 (evictable, LRU order);
- held: in the hash map with pin count > 0 (a pending storage write or a load in progress reads
  it), never evicted or overwritten.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any

from radixkv.cache.keys import TOKEN_BYTES, token_key

HASH_BYTES = 16


def namespace_seed(fingerprint: str, namespace: Hashable | None) -> bytes:
    """h_0: the chain's seed for one model fingerprint and one cache salt (namespace)."""
    salt = "" if namespace is None else repr(namespace)
    data = f"radixkv-tiers/1\0{fingerprint}\0{salt}".encode()
    return hashlib.blake2b(data, digest_size=HASH_BYTES).digest()


def chain_hashes(
    tokens: Any, page_size: int, seed: bytes, done: Sequence[bytes] = ()
) -> list[bytes]:
    """Hashes of every whole page of `tokens`; `done` are already computed leading hashes (the
    chain only grows as a request's tokens do, so callers extend instead of recomputing)."""
    key = token_key(tokens)
    pb = page_size * TOKEN_BYTES
    out = list(done)
    prev = out[-1] if out else seed
    for start in range(len(out) * pb, len(key) - pb + 1, pb):
        prev = hashlib.blake2b(prev + key[start : start + pb], digest_size=HASH_BYTES).digest()
        out.append(prev)
    return out


class HostIndex:
    """Which host pages hold which chained page hash; LRU among the unpinned ones."""

    def __init__(self, num_pages: int) -> None:
        if num_pages < 1:
            raise ValueError("the host pool needs at least one page")
        self.num_pages = num_pages
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._by_hash: OrderedDict[bytes, int] = OrderedDict()  # LRU order: oldest first
        self._hash_of: dict[int, bytes] = {}
        self._pins: dict[int, int] = {}  # page -> pin count (> 0 only)
        self._origin: dict[int, str] = {}  # page -> "device" | "storage" (where the copy came from)
        self.dropped_pages = 0
        # (added, hash) of every change, in order, when a list (KV events read it); else off.
        self.journal: list[tuple[bool, bytes]] | None = None

    # -- queries -------------------------------------------------------------------------------
    def lookup(self, h: bytes, touch: bool = True) -> int | None:
        page = self._by_hash.get(h)
        if page is not None and touch:
            self._by_hash.move_to_end(h)
        return page

    def hashes(self) -> list[bytes]:
        """Every page hash L2 holds, least recently used first."""
        return list(self._by_hash)

    def origin(self, page: int) -> str:
        return self._origin.get(page, "device")

    def hash_of(self, page: int) -> bytes:
        return self._hash_of[page]

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def held_pages(self) -> int:
        return len(self._pins)

    @property
    def cached_pages(self) -> int:
        return len(self._by_hash) - len(self._pins)

    def census(self) -> tuple[int, int, int]:
        """(free, cached, held) in pages."""
        return self.free_pages, self.cached_pages, self.held_pages

    # -- changes -------------------------------------------------------------------------------
    def alloc(self, n: int) -> list[int] | None:
        """`n` pages taken from the free list, dropping least recently used unpinned pages when
        short; None (nothing changed) when even that cannot find `n`."""
        if n > len(self._free) + self.cached_pages:
            return None
        if n > len(self._free):
            for h in list(self._by_hash):  # oldest first; pinned pages are skipped
                if len(self._free) >= n:
                    break
                page = self._by_hash[h]
                if page not in self._pins:
                    self._drop(h, page)
        out = self._free[len(self._free) - n :]
        del self._free[len(self._free) - n :]
        return out

    def release(self, pages: Sequence[int]) -> None:
        """Return pages taken by `alloc` but never added (e.g. a copy that was abandoned)."""
        for p in pages:
            if p in self._hash_of or p in self._free:
                raise ValueError(f"host page {p} is not an allocated, unindexed page")
        self._free.extend(pages)

    def add(self, h: bytes, page: int, origin: str = "device") -> None:
        """File an allocated page under `h` (its contents must already be written)."""
        if h in self._by_hash:
            raise ValueError("hash already has a host page")
        self._by_hash[h] = page
        self._hash_of[page] = h
        self._origin[page] = origin
        if self.journal is not None:
            self.journal.append((True, h))

    def pin(self, page: int) -> None:
        if page not in self._hash_of:
            raise ValueError(f"pin of unindexed host page {page}")
        self._pins[page] = self._pins.get(page, 0) + 1

    def unpin(self, page: int) -> None:
        n = self._pins.get(page, 0)
        if n <= 0:
            raise ValueError(f"unpin of host page {page} that is not pinned")
        if n == 1:
            del self._pins[page]
        else:
            self._pins[page] = n - 1

    def mark_origin(self, page: int, origin: str) -> None:
        self._origin[page] = origin

    def clear(self) -> None:
        """Drop every unpinned page (pinned ones stay until their pins go)."""
        for h, page in list(self._by_hash.items()):
            if page not in self._pins:
                self._drop(h, page)

    def _drop(self, h: bytes, page: int) -> None:
        del self._by_hash[h]
        del self._hash_of[page]
        self._origin.pop(page, None)
        self._free.append(page)
        self.dropped_pages += 1
        if self.journal is not None:
            self.journal.append((False, h))

    def check(self) -> None:
        """Raise AssertionError unless the census balances and the maps agree."""
        free, cached, held = self.census()
        assert free + cached + held == self.num_pages, (
            f"host census broken: free {free} + cached {cached} + held {held} != {self.num_pages}"
        )
        assert len(set(self._free)) == len(self._free), "host free list holds a page twice"
        assert not set(self._free) & set(self._hash_of), "a free host page is indexed"
        assert all(self._hash_of[p] == h for h, p in self._by_hash.items()), "maps disagree"
        assert set(self._pins) <= set(self._hash_of), "a pinned host page is not indexed"

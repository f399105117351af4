"""A deliberately naive prefix-cache model used as the oracle in differential tests.

It stores one entry per cached PAGE, keyed by the whole token prefix that ends with that page:
``(namespace, tokens[: (k + 1) * page_size]) -> PageInfo`` and answers every question with linear
scans. It knows nothing about edges, splits or heaps, so it shares no logic (and no bug) with the
real caches.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

Key = tuple[Hashable | None, tuple[int, ...]]


@dataclass
class PageInfo:
    slots: list[int]
    last_access: int
    hits: int
    created: int
    priority: int
    stamp: int = 0  # BlockHashCache free-queue position: when it last became/was touched free


class ReferenceCache:
    def __init__(self, page_size: int) -> None:
        self.page = page_size
        self.entries: dict[Key, PageInfo] = {}
        self.locks: list[Key] = []  # one entry per outstanding lock: the locked prefix
        self.clock = 0
        self.stamps = 0

    def _pages(self, tokens: tuple[int, ...], ns: Hashable | None, n: int) -> list[PageInfo]:
        p = self.page
        return [self.entries[(ns, tokens[: (k + 1) * p])] for k in range(n // p)]

    def cached_len(self, tokens: tuple[int, ...], ns: Hashable | None) -> int:
        n = 0
        while n + self.page <= len(tokens) and (ns, tokens[: n + self.page]) in self.entries:
            n += self.page
        return n

    def slots_of(self, tokens: tuple[int, ...], ns: Hashable | None, n: int) -> list[int]:
        return [s for info in self._pages(tokens, ns, n) for s in info.slots]

    def touch(self, tokens: tuple[int, ...], ns: Hashable | None, n: int, prio: int = 0) -> None:
        self.clock += 1
        for info in self._pages(tokens, ns, n):
            info.last_access = self.clock
            info.hits += 1
            info.priority = max(info.priority, prio)

    def insert(
        self, tokens: tuple[int, ...], slots: list[int], ns: Hashable | None, prio: int
    ) -> int:
        p = self.page
        cached = self.cached_len(tokens, ns)
        self.touch(tokens, ns, cached, prio)
        for start in range(cached, len(tokens) - len(tokens) % p, p):
            info = PageInfo(slots[start : start + p], self.clock, 1, self.clock, prio)
            self.entries[(ns, tokens[: start + p])] = info
        self.restamp(tokens, ns, len(tokens) - len(tokens) % p)
        return cached

    def restamp(self, tokens: tuple[int, ...], ns: Hashable | None, n: int) -> None:
        """Model of the block-hash free queue: the unlocked pages of a touched or released chain
        move to its back, deepest first."""
        for k in reversed(range(n // self.page)):
            key = (ns, tokens[: (k + 1) * self.page])
            if self.lock_count(key) == 0:
                self.stamps += 1
                self.entries[key].stamp = self.stamps

    def lock_count(self, key: Key) -> int:
        ns, prefix = key
        return sum(1 for lns, lp in self.locks if lns == ns and lp[: len(prefix)] == prefix)

    def terminal_unlocked(self) -> list[Key]:
        """Cached pages without a cached next page and with no lock: the pages that end an
        evictable leaf."""
        has_child = {(ns, p[: -self.page]) for ns, p in self.entries}
        return [k for k in self.entries if k not in has_child and self.lock_count(k) == 0]

    def by_slot(self) -> dict[int, Key]:
        return {s: key for key, info in self.entries.items() for s in info.slots}

    def protected_tokens(self) -> int:
        return self.page * sum(1 for k in self.entries if self.lock_count(k) > 0)

    def total_tokens(self) -> int:
        return self.page * len(self.entries)

    def has_unlocked(self) -> bool:
        return any(self.lock_count(k) == 0 for k in self.entries)

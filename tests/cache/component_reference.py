"""A naive per-page model of the component tree (FULL + SWA + STATE), the oracle of the
differential tests. One entry per cached page, keyed by the whole prefix ending with it; every
question is answered by linear scans over token positions. It knows nothing of edges or splits.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

Key = tuple[Hashable | None, tuple[int, ...]]


@dataclass
class Page:
    full: list[int]
    swa: list[int]  # -1 = tombstone
    ckpt: int = -1  # checkpoint valid at this page's end


class ComponentReference:
    def __init__(self, page: int, window: int | None, full: bool, state: bool) -> None:
        self.page = page
        self.window = window
        self.full = full
        self.state = state
        self.pages: dict[Key, Page] = {}
        self.locks: list[tuple[Hashable | None, tuple[int, ...]]] = []  # locked prefixes

    def _page_list(self, ns: Hashable | None, toks: tuple[int, ...]) -> list[Page]:
        out = []
        p = self.page
        while (len(out) + 1) * p <= len(toks):
            page = self.pages.get((ns, toks[: (len(out) + 1) * p]))
            if page is None:
                break
            out.append(page)
        return out

    def shared(self, ns: Hashable | None, toks: tuple[int, ...]) -> int:
        return len(self._page_list(ns, toks)) * self.page

    def accepts(self, ns: Hashable | None, toks: tuple[int, ...], b: int) -> bool:
        """Every component's vote at boundary b (b <= shared)."""
        if b == 0:
            return True
        pages = self._page_list(ns, toks)[: b // self.page]
        if self.window is not None:
            swa = [s for pg in pages for s in pg.swa]
            if any(s < 0 for s in swa[max(0, b - self.window) : b]):
                return False
        return not self.state or pages[-1].ckpt >= 0

    def match(self, ns: Hashable | None, toks: tuple[int, ...]) -> tuple[int, list, list, int]:
        shared = self.shared(ns, toks)
        b = max(x for x in range(0, shared + 1, self.page) if self.accepts(ns, toks, x))
        pages = self._page_list(ns, toks)[: b // self.page]
        full = [s for pg in pages for s in pg.full] if self.full else []
        swa = [s for pg in pages for s in pg.swa]
        if self.window is not None:
            swa = [-1 if i < b - self.window else s for i, s in enumerate(swa)]
        ckpt = pages[-1].ckpt if pages and self.state else -1
        return b, full, swa, ckpt

    def insert(
        self,
        ns: Hashable | None,
        toks: tuple[int, ...],
        full: list[int],
        swa: list[int],
        ckpts: list[tuple[int, int]],
        owned_from: int,
    ) -> tuple[int, set[int], set[int]]:
        """(cached, expected swa_free set, expected rejected checkpoint ids)."""
        p = self.page
        end = len(toks) - len(toks) % p
        cached = self.shared(ns, toks[:end])
        free: set[int] = set()
        for k in range(end // p):
            key = (ns, toks[: (k + 1) * p])
            lo, hi = k * p, (k + 1) * p
            if key not in self.pages:
                self.pages[key] = Page(
                    list(full[lo:hi]) if self.full else [],
                    list(swa[lo:hi]) if self.window is not None else [],
                )
                continue
            if self.window is None:
                continue
            page = self.pages[key]
            for i in range(lo, hi):
                if i < owned_from or swa[i] < 0:
                    continue
                if page.swa[i - lo] < 0:
                    page.swa[i - lo] = swa[i]
                else:
                    free.add(swa[i])
        rejected: set[int] = set()
        for b, cid in ckpts:
            if not self.state or b <= 0 or b > end or b % p:
                rejected.add(cid)
                continue
            page = self.pages[(ns, toks[:b])]
            if page.ckpt >= 0:
                rejected.add(cid)
            else:
                page.ckpt = cid
        return cached, free, rejected

    def locked_windows(self) -> set[tuple[Key, int]]:
        """(page key, offset in the page) of every SWA entry inside a locked window."""
        out = set()
        p = self.page
        for ns, toks in self.locks:
            b = len(toks)
            lo = 0 if self.window is None else max(0, b - self.window)
            for i in range(lo, b):
                out.add(((ns, toks[: (i // p + 1) * p]), i % p))
        return out

    def is_locked_page(self, key: Key) -> bool:
        ns, prefix = key
        return any(lns == ns and toks[: len(prefix)] == prefix for lns, toks in self.locks)

    def has_children(self, key: Key) -> bool:
        ns, prefix = key
        return any(
            k[0] == ns and len(k[1]) > len(prefix) and k[1][: len(prefix)] == prefix
            for k in self.pages
        )

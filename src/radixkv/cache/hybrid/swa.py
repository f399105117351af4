"""The SWA component of the hybrid tree: per-token sliding-window K/V with tombstones.

Each node of a tree with SWA carries `node.swa`, one SWA slot per token, TOMBSTONE (-1) where
the K/V was freed (or never kept). A boundary B is usable only if the `window` tokens before it
have live entries. `SwaComponent` keeps the component's ledger and registry and implements its
part of match (the vote), insert (adopting the caller's slots where the tree has tombstones),
split, and eviction by trimming (a `TreeComponent`, component.py).

Invariants (checked by `check`):
- tombstones are whole pages; `size` == live SWA entries in the tree; no slot twice;
- `nodes` holds exactly the nodes with live SWA entries;
- trimming keeps the window before every *kept boundary*: the end of a leaf, of a branching node,
  and of a node some handle is locked at. Ends of pass-through nodes (e.g. where a running
  request committed a prefill chunk) lose their windows, so a long locked prompt holds about W
  tokens of SWA, not W per chunk. A locked request's resume point is a kept boundary, so
  trimming never breaks a locked window.
- trimming is page-granular and frees the pages furthest back from a kept boundary first, so
  under pressure a cached chain keeps one live run ending at its boundary and every boundary
  inside that run stays reusable.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np

from radixkv.cache.base import SlotArray
from radixkv.cache.hybrid.component import InsertSite
from radixkv.cache.hybrid.components import TOMBSTONE
from radixkv.cache.integrity import check_unique_slots
from radixkv.cache.keys import concat_slots, frozen_copy, slot_array
from radixkv.cache.node import Node, is_lock_end


def _fail(msg: str) -> NoReturn:
    raise AssertionError(f"component integrity: {msg}")


class SwaComponent:
    """Sliding-window K/V of one hybrid tree (see the module docstring)."""

    kind = "swa"
    per_token = True

    def __init__(self, window: int | None, page_size: int, key: Callable[[Any], Any]) -> None:
        if window is None or window < 1:
            raise ValueError(f"swa needs a window >= 1, e.g. 'swa:4096' (got {window})")
        self.window = window
        self.page_size = page_size
        self._key = key  # the eviction policy's order: least valuable first
        self.size = 0  # live SWA entries held by the tree
        self.nodes: dict[int, Node] = {}  # id(node) -> node with live SWA entries

    def _track(self, node: Node) -> None:
        """Keep `nodes` exact for `node` after its SWA array changed."""
        assert node.swa is not None
        if bool((node.swa >= 0).any()):
            self.nodes[id(node)] = node
        else:
            self.nodes.pop(id(node), None)

    # ---------------------------------------------------------------- match

    def vote(self, path: list[Node], shared: int) -> Callable[[int], int]:
        runs = self.tombstone_runs(path, shared)
        return lambda p: self.deepest(runs, p)

    def matched(self, path: list[Node], length: int) -> SlotArray:
        return self.window_slots(path, length)

    def empty(self) -> SlotArray:
        return concat_slots([])

    def tombstone_runs(self, path: list[Node], shared: int) -> tuple[list[int], list[int]]:
        """The runs of tombstones among the first `shared` tokens of `path`: (starts, ends),
        ascending, each run [start, end) maximal."""
        if not path:
            return [], []
        swa = np.concatenate([n.swa for n in path if n.swa is not None])[:shared]
        edges = np.diff(np.concatenate(([0], (swa < 0).view(np.int8), [0])))
        return np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()

    def deepest(self, runs: tuple[list[int], list[int]], p: int) -> int:
        """The deepest page boundary <= p whose `window` tokens before it are all live. Every
        boundary inside a run of tombstones, or at its end, has one just before it, so the
        search jumps a whole run at a time: O(runs it passes), not O(tokens)."""
        starts, ends = runs
        while True:
            k = bisect.bisect_left(starts, p) - 1  # the last run starting before p
            if k < 0 or min(ends[k], p) - 1 < p - self.window:
                return p
            start = starts[k]
            p = start - start % self.page_size  # tombstones are whole pages: == start

    def window_slots(self, path: list[Node], length: int) -> SlotArray:
        """SWA slots of the first `length` tokens of `path`, -1 before the window."""
        swa = concat_slots([n.swa for n in path if n.swa is not None])[:length]
        swa[: max(0, length - self.window)] = TOMBSTONE
        return swa

    # ---------------------------------------------------------------- insert and split

    def prepare(self, part: Any, ntok: int) -> SlotArray:
        """One SWA slot per token (-1 where the caller already freed it)."""
        if part is None:
            raise ValueError("an insert into a tree with SWA needs its SWA slots")
        return slot_array(part, ntok)

    def adopt(self, site: InsertSite, part: SlotArray) -> SlotArray:
        """Revive the cached path's tombstones from `part`, give the new leaf its slots;
        the caller's duplicates come back."""
        dup = self.revive(site.path, part, site.owned_from)
        if site.leaf is not None:
            self.adopt_leaf(site.leaf, part[site.cached : site.end])
        return dup

    def split(self, upper: Node, lower: Node) -> None:
        """`lower` lost its first `upper.ntok` tokens to the new `upper`."""
        ntok = upper.ntok
        swa = lower.swa
        assert swa is not None
        upper.swa = frozen_copy(swa[:ntok])
        lower.swa = frozen_copy(swa[ntok:])
        self._track(upper)
        self._track(lower)

    def adopt_leaf(self, leaf: Node, swa: SlotArray) -> None:
        """A new leaf takes the caller's SWA slots for its tokens (tombstones included)."""
        leaf.swa = frozen_copy(swa)
        self.size += int((leaf.swa >= 0).sum())
        self._track(leaf)

    def revive(self, path: list[Node], swa: SlotArray, owned_from: int) -> SlotArray:
        """For the already-cached range: adopt the caller's SWA slots where the tree has
        tombstones (positions >= owned_from only); return the caller's others (duplicates)."""
        dup: list[SlotArray] = []
        pos = 0
        for node in path:
            lo = max(owned_from, pos) - pos
            if lo < node.ntok:
                assert node.swa is not None
                mine = swa[pos + lo : pos + node.ntok]
                take = (node.swa[lo:] < 0) & (mine >= 0)
                if take.any():
                    new = node.swa.copy()
                    new[lo:][take] = mine[take]
                    new.flags.writeable = False
                    node.swa = new
                    self.size += int(take.sum())
                    self._track(node)
                rest = mine[~take]
                dup.append(rest[rest >= 0])
            pos += node.ntok
        return concat_slots(dup)

    # ---------------------------------------------------------------- eviction

    @staticmethod
    def _kept(node: Node) -> bool:
        """A boundary whose window trimming keeps (see the module docstring)."""
        return len(node.children) != 1 or is_lock_end(node)

    def _reach(self, node: Node) -> tuple[int, Node]:
        """(tokens from `node`'s end down to the nearest kept boundary at or below it, that
        boundary's node): walks down the pass-through chain below `node`."""
        below = 0
        n = node
        while not self._kept(n):
            (n,) = n.children.values()
            below += n.ntok
        return below, n

    def keep_from(self, node: Node) -> int:
        """First edge-relative position of `node` some kept boundary's window needs (page
        floored); `node.ntok` when none does."""
        return self._keep_from(node, self._reach(node)[0])

    def _keep_from(self, node: Node, below: int) -> int:
        cut = node.ntok + below - self.window
        if cut <= 0:
            return 0
        cut = min(cut, node.ntok)
        return cut - cut % self.page_size

    def trim(self, want: int, out: list[SlotArray]) -> int:
        """Tombstone K/V outside every kept boundary's window, page by page, until `want`
        slots are freed (at most one page more; appended to `out`); returns how many.

        Order: a pass-through chain and the kept boundary ending it form one group; groups go
        in the policy order of their kept node (least valuable first), and inside a group the
        pages furthest from the boundary go first. So what stays live of a chain is one run
        ending at its kept boundary, and every boundary inside that run whose window it covers
        stays reusable (a prompt sharing only part of a cached conversation still resumes
        past the window). O(n log n) in the nodes holding SWA; runs only when the pool is
        short."""
        cands: list[tuple[Any, int, int, int, Node]] = []
        for node in self.nodes.values():
            below, bottom = self._reach(node)
            keep = self._keep_from(node, below)
            if keep > 0:
                cands.append((self._key(bottom), id(bottom), node.depth, keep, node))
        cands.sort(key=lambda c: c[:3])
        got = 0
        ps = self.page_size
        for _, _, _, keep, node in cands:
            if got >= want:
                break
            assert node.swa is not None
            live = np.flatnonzero(node.swa[:keep] >= 0)  # whole pages (tombstones are)
            take = live[: -(-(want - got) // ps) * ps]
            if len(take):
                out.append(node.swa[take].copy())
                new = node.swa.copy()
                new[take] = TOMBSTONE
                new.flags.writeable = False
                node.swa = new
                got += len(take)
                self._track(node)
        self.size -= got
        return got

    def window_intact(self, node: Node) -> bool:
        """No tombstone among the `window` SWA entries before `node`'s end."""
        need = self.window
        n: Node | None = node
        while need > 0 and n is not None and n.parent is not None:
            assert n.swa is not None
            if bool((n.swa[max(0, n.ntok - need) :] < 0).any()):
                return False
            need -= n.ntok
            n = n.parent
        return True

    def intact(self, node: Node) -> bool:
        return self.window_intact(node)

    def prune(self, intact: Callable[[Node], bool], out: list[SlotArray]) -> int:
        """Trimming elsewhere leaves every SWA entry usable (nothing to drop)."""
        return 0

    def collect(self, out: list[SlotArray]) -> SlotArray:
        return concat_slots(out)

    def values(self) -> list[int]:
        return [int(s) for n in self.nodes.values() if n.swa is not None for s in n.swa if s >= 0]

    @staticmethod
    def stray(node: Node) -> bool:
        return node.swa is not None

    def forget(self, node: Node, out: list[SlotArray]) -> int:
        """A node left the tree: its live SWA slots go to `out`; returns how many."""
        if node.swa is None:
            return 0
        live = node.swa[node.swa >= 0]
        out.append(live)
        self.size -= len(live)
        self.nodes.pop(id(node), None)
        return len(live)

    def evictable(self, nodes: list[Node]) -> int:
        """Live SWA entries eviction could free now: everything on unlocked nodes plus what
        trimming frees on locked ones. O(nodes); for admission estimates and tests."""
        total = 0
        for n in nodes:
            assert n.swa is not None
            if n.lock == 0:
                total += int((n.swa >= 0).sum())
            else:
                total += int((n.swa[: self.keep_from(n)] >= 0).sum())
        return total

    # ---------------------------------------------------------------- checks

    def check(self, nodes: list[Node]) -> None:
        """Recompute the ledger and registry from `nodes` (every node of the tree)."""
        live_parts = []
        for node in nodes:
            swa = node.swa
            where = f"node of {node.ntok} tokens"
            if swa is None or len(swa) != node.ntok or swa.flags.writeable:
                _fail(f"{where}: SWA array missing, of the wrong length, or writable")
            pages = (swa >= 0).reshape(-1, self.page_size)
            if (pages.any(axis=1) != pages.all(axis=1)).any():
                _fail(f"{where}: a tombstone covers part of a page")
            if bool((swa >= 0).any()) != (id(node) in self.nodes):
                _fail(f"{where}: live SWA entries and the registry disagree")
            live_parts.append(swa[swa >= 0])
        total = check_unique_slots(live_parts)
        if total != self.size:
            _fail(f"swa_size {self.size} but the tree holds {total} live SWA slots")
        if any(not n.alive for n in self.nodes.values()):
            _fail("a dead node is still in the SWA registry")

"""Eviction of the hybrid tree across its components (`ComponentEviction`); metadata only, no
torch. `HybridCache` (`cache.py`) hands it its components and two operations of the tree core
(`RadixTree`: the next victim leaf in policy order, page-granular; the removal of a leaf), and
answers `evict` and `reset` through it.

Eviction is asked per kind (`evict({kind: n})`, FULL tokens, SWA slots, checkpoints):

1. Each asked component trims what it can without removing nodes, in the tree's order (SWA:
   K/V outside every kept boundary's window, page by page, only as many pages as asked and the
   furthest back first; STATE: checkpoints by policy), and every other one prunes what that
   left unusable (checkpoints whose window went).
2. Then unlocked leaves go in policy order through the core's page-granular removal, freeing
   every component they hold, while FULL or a per-token component is short: only a leaf's tail
   pages while FULL alone is short; a victim leaf goes whole when SWA is still short, since after
   trimming every leaf holds no more than its own last window, and cutting its tail would leave
   no usable boundary in it.
3. A per-token component still short trims again: removed leaves turned branch points into
   pass-through nodes, whose windows are no longer kept.

The caller frees what comes back (`Freed`: FULL slots, and each kind's value).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from radixkv.cache.base import SlotArray
from radixkv.cache.hybrid.component import TreeComponent
from radixkv.cache.hybrid.components import FULL, Freed
from radixkv.cache.keys import concat_slots
from radixkv.cache.node import Node

ALL = 1 << 62  # "no page-granular limit": a victim leaf goes whole


class ComponentEviction:
    """The hybrid tree's eviction order over its components (module docstring)."""

    def __init__(
        self,
        parts: Sequence[TreeComponent],
        has_full: bool,
        pop_victim: Callable[[int], Node | None],
        remove_leaf: Callable[[Node], None],
    ) -> None:
        """`parts`: the tree's components in its order; `pop_victim(need)`: the next unlocked
        leaf in policy order, cut to its last pages holding about `need` FULL tokens (None: no
        victim left); `remove_leaf(node)`: take that leaf out of the tree."""
        self.parts = tuple(parts)
        self.has_full = has_full
        self._per_token = tuple(c for c in self.parts if c.per_token)
        self._pop_victim = pop_victim
        self._remove_leaf = remove_leaf

    def evict(self, want: Mapping[str, int]) -> Freed:
        """Free at least `want[kind]` of each kind where possible (kinds the tree lacks are
        ignored): trims, then leaves while FULL or a per-token component is short, then trims
        again for what is still short."""
        out: dict[str, list[Any]] = {c.kind: [] for c in self.parts}
        got = dict.fromkeys(out, 0)
        for c in self.parts:
            if want.get(c.kind, 0) > got[c.kind]:
                self._trim(c, want[c.kind] - got[c.kind], out, got)
        want_full = want.get(FULL, 0)
        full_parts: list[SlotArray] = []
        got_full = 0
        short = self._short(want, got)
        while got_full < want_full or short:
            # Page-granular while FULL alone is short; a leaf goes whole when another kind is.
            node = self._pop_victim(want_full - got_full if not short else ALL)
            if node is None:
                break
            self._remove_leaf(node)
            if self.has_full:
                full_parts.append(node.slots)
                got_full += node.ntok
            for c in self.parts:
                got[c.kind] += c.forget(node, out[c.kind])
            short = self._short(want, got)
        for c in short:  # removed leaves turned branch points into pass-through nodes
            self._trim(c, want[c.kind] - got[c.kind], out, got)
        kinds = {c.kind: c.collect(out[c.kind]) for c in self.parts}
        return Freed(concat_slots(full_parts), kinds)

    def drop(self, nodes: list[Node]) -> Freed:
        """Every component's data on `nodes`, which all left the tree (a reset)."""
        full = concat_slots([n.slots for n in nodes]) if self.has_full else concat_slots([])
        out: dict[str, list[Any]] = {c.kind: [] for c in self.parts}
        for n in nodes:
            for c in self.parts:
                c.forget(n, out[c.kind])
        return Freed(full, {c.kind: c.collect(out[c.kind]) for c in self.parts})

    def _short(self, want: Mapping[str, int], got: dict[str, int]) -> list[TreeComponent]:
        """The per-token components an eviction has not freed enough of yet."""
        return [c for c in self._per_token if got[c.kind] < want.get(c.kind, 0)]

    def _trim(
        self, comp: TreeComponent, n: int, out: dict[str, list[Any]], got: dict[str, int]
    ) -> None:
        """`comp` trims up to `n`; every other component prunes what that left unusable."""
        trimmed = comp.trim(n, out[comp.kind])
        got[comp.kind] += trimmed
        if trimmed:
            for c in self.parts:
                if c is not comp:
                    got[c.kind] += c.prune(comp.intact, out[c.kind])

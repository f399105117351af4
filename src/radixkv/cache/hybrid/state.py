"""The STATE component of the hybrid tree: recurrent / conv state checkpoints on boundaries.

A node of a tree with STATE may carry `node.ckpt`, the id of a checkpoint (a state slot holding
the state after exactly the tokens up to the node's end), or -1. A boundary is usable if it is 0
or carries a checkpoint; cached checkpoints are never written (a request copies one at
admission). `StateComponent` keeps the registry and implements the component's part of match
(candidate boundaries), insert (attaching), and eviction (dropping): a `TreeComponent`
(component.py).

Invariants (checked by `check`):
- the registry holds exactly the nodes with `ckpt >= 0`; no checkpoint id twice;
- a checkpoint at a node some handle is locked at is never dropped by policy (its request copies
  it at admission); others go by policy, or when their SWA window is trimmed (they can never be
  resumed from then).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

from radixkv.cache.hybrid.component import InsertSite
from radixkv.cache.node import Node, is_lock_end


class StateComponent:
    """Checkpoints of one hybrid tree (see the module docstring)."""

    kind = "state"
    per_token = False

    def __init__(self, arg: int | None, page_size: int, key: Callable[[Any], Any]) -> None:
        if arg is not None:
            raise ValueError(f"state takes no argument (got state:{arg})")
        self.page_size = page_size
        self._key = key  # the eviction policy's order: least valuable first
        self.nodes: dict[int, Node] = {}  # id(node) -> node with ckpt >= 0

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def size(self) -> int:
        return len(self.nodes)

    def values(self) -> list[int]:
        return self.ids()

    # -- match

    def vote(self, path: list[Node], shared: int) -> Callable[[int], int]:
        ends = self.boundaries(path, shared)
        return lambda p: ends[bisect.bisect_right(ends, p) - 1]

    def matched(self, path: list[Node], length: int) -> int:
        return path[-1].ckpt

    def empty(self) -> int:
        return -1

    # -- insert and split

    def prepare(self, part: Any, ntok: int) -> Sequence[tuple[int, int]]:
        """(boundary, checkpoint id) pairs; none when `part` is None."""
        return part if part is not None else ()

    def adopt(self, site: InsertSite, part: Sequence[tuple[int, int]]) -> tuple[int, ...]:
        """File each checkpoint at its boundary (a whole number of pages within the inserted
        prefix, splitting an edge there); the ids not taken come back."""
        rejected: list[int] = []
        ps = self.page_size
        for p, cid in part:
            node = site.node_at(p) if 0 < p <= site.end and p % ps == 0 else None
            if node is None or not self.attach(node, cid):
                rejected.append(cid)
        return tuple(rejected)

    def split(self, upper: Node, lower: Node) -> None:
        """A checkpoint stays with `lower`: it is valid at lower's end."""

    def ids(self) -> list[int]:
        return [n.ckpt for n in self.nodes.values()]

    def boundaries(self, path: list[Node], shared: int) -> list[int]:
        """Candidate boundaries <= `shared` along `path`, ascending: 0 and every node end with
        a checkpoint."""
        ends, pos = [0], 0
        for n in path:
            pos += n.ntok
            if pos <= shared and n.ckpt >= 0:
                ends.append(pos)
        return ends

    def attach(self, node: Node, ckpt: int) -> bool:
        """File checkpoint `ckpt` at `node`'s end; False (not taken) if one is already there."""
        if node.ckpt >= 0:
            return False
        node.ckpt = ckpt
        self.nodes[id(node)] = node
        return True

    def _take(self, node: Node, out: list[int]) -> None:
        out.append(node.ckpt)
        node.ckpt = -1
        del self.nodes[id(node)]

    # -- eviction

    def forget(self, node: Node, out: list[int]) -> int:
        """A node left the tree: its checkpoint (if any) goes to `out`."""
        if node.ckpt < 0:
            return 0
        self._take(node, out)
        return 1

    def prune(self, intact: Callable[[Node], bool], out: list[int]) -> int:
        """Drop (into `out`) every checkpoint whose boundary another component no longer
        accepts (its SWA window was trimmed)."""
        gone = [n for n in self.nodes.values() if not intact(n)]
        for node in gone:
            self._take(node, out)
        return len(gone)

    def trim(self, want: int, out: list[int]) -> int:
        """Up to `want` checkpoints in policy order (into `out`), except where a handle is
        locked (a request admitted there may not have copied its checkpoint yet)."""
        cands = [n for n in self.nodes.values() if not is_lock_end(n)]
        take = sorted(cands, key=self._key)[:want]
        for node in take:
            self._take(node, out)
        return len(take)

    def intact(self, node: Node) -> bool:
        return node.ckpt >= 0

    def collect(self, out: list[int]) -> tuple[int, ...]:
        return tuple(out)

    def evictable(self, nodes: list[Node]) -> int:
        return sum(1 for n in self.nodes.values() if not is_lock_end(n))

    @staticmethod
    def stray(node: Node) -> bool:
        return node.ckpt >= 0

    def check(self, nodes: list[Node]) -> None:
        """Recompute the registry from `nodes` (every node of the tree)."""
        held = {id(n): n.ckpt for n in nodes if n.ckpt >= 0}
        if set(held) != set(self.nodes):
            raise AssertionError(
                "component integrity: checkpoint registry disagrees with the nodes carrying them"
            )
        ids = list(held.values())
        if len(set(ids)) != len(ids):
            raise AssertionError(f"component integrity: a checkpoint id is held twice: {ids}")

"""The STATE component of the hybrid tree: recurrent / conv state checkpoints on boundaries.

A node of a tree with STATE may carry `node.ckpt`, the id of a checkpoint (a state slot holding
the state after exactly the tokens up to the node's end), or -1. A boundary is usable if it is 0
or carries a checkpoint; cached checkpoints are never written (a request copies one at
admission). `StateComponent` keeps the registry and implements the component's part of match
(candidate boundaries), insert (attaching), and eviction (dropping).

Invariants (checked by `check`):
- the registry holds exactly the nodes with `ckpt >= 0`; no checkpoint id twice;
- a checkpoint at a node some handle is locked at is never dropped by policy (its request copies
  it at admission); others go by policy, or when their SWA window is trimmed (they can never be
  resumed from then).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixkv.cache.node import Node, is_lock_end


class StateComponent:
    """Checkpoints of one hybrid tree (see the module docstring)."""

    def __init__(self, key: Callable[[Any], Any]) -> None:
        self._key = key  # the eviction policy's order: least valuable first
        self.nodes: dict[int, Node] = {}  # id(node) -> node with ckpt >= 0

    def __len__(self) -> int:
        return len(self.nodes)

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

    def forget(self, node: Node, out: list[int]) -> None:
        """A node left the tree: its checkpoint (if any) goes to `out`."""
        if node.ckpt >= 0:
            self._take(node, out)

    def drop_blind(self, intact: Callable[[Node], bool], out: list[int]) -> None:
        """Drop (into `out`) every checkpoint whose SWA window is no longer `intact`."""
        for node in list(self.nodes.values()):
            if not intact(node):
                self._take(node, out)

    def drop(self, want: int, out: list[int]) -> None:
        """Up to `want` checkpoints in policy order (into `out`), except where a handle is
        locked (a request admitted there may not have copied its checkpoint yet)."""
        cands = [n for n in self.nodes.values() if not is_lock_end(n)]
        for node in sorted(cands, key=self._key)[:want]:
            self._take(node, out)

    def droppable_all_locked(self) -> bool:
        """Every remaining checkpoint sits where a handle is locked (for tests)."""
        return all(is_lock_end(n) for n in self.nodes.values())

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

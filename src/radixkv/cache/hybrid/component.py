"""The contract of one component of the hybrid tree besides FULL (`TreeComponent`): what each
kind the tree keeps (SWA in `swa.py`, STATE in `state.py`) answers, so that `HybridCache`
iterates its components without naming one. No torch.

A component keeps its own ledger and registry of the nodes that carry its data, and takes part in
every operation of the tree:

- vote: on a match, the deepest boundary it accepts at or before a candidate (the tree takes the
  deepest one every component accepts, a fixed point), and its part of the match (`matched`);
- split: an edge was cut in two, the data moves with its tokens;
- adopt: an insert hands it the caller's part (validated first, `prepare`), over the cached path
  and the new leaf; it answers what it refused (the caller frees it);
- trim: free data without removing nodes (SWA K/V outside every kept window, checkpoints by
  policy); the others `prune` what that left unusable (a checkpoint whose window went);
- forget: a node left the tree (eviction, reset), its data goes to the freed list;
- check: recompute the ledger and registry from the nodes.

A tree is built from `ComponentSpec`s (a component class and its argument, below), which the
engine's registry of kinds answers for a model (engine/kv/kinds.py, `Kind.tree`); the tree has
no registry of its own, so a new kind the tree keeps is a module implementing this plus that one
engine line. Its per-node data may live in its own registry keyed by node (as `StateComponent`
keeps its nodes), so the tree's `Node` need not change. The built-in kinds also have names
("swa:4096", "state") for hand-built trees (`names.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from radixkv.cache.node import Node

Policy = Callable[[Any], Any]  # the eviction policy's order of nodes: least valuable first


@dataclass
class InsertSite:
    """Where an insert lands: `path` the cached nodes it walked (tokens [0, cached)), `leaf` the
    new leaf (tokens [cached, end); None when everything was cached), `owned_from` the first
    position not of the caller's locked match, and `node_at(p)`: the node ending exactly at
    boundary p (0 < p <= end, a page multiple), splitting an edge there if needed (None when p
    is not on the path)."""

    path: list[Node]
    leaf: Node | None
    cached: int
    end: int
    owned_from: int
    node_at: Callable[[int], Node | None]


class TreeComponent(Protocol):
    """One kind of the hybrid tree besides FULL (module docstring). `per_token`: data on every
    token (a part is required on insert; removing leaves frees it, so an eviction short of it
    removes leaves), else data at boundaries only (trimming alone can free all that is free)."""

    kind: str
    per_token: bool

    def __init__(self, arg: int | None, page_size: int, key: Policy) -> None: ...

    @property
    def size(self) -> int:
        """Units held (live SWA slots, checkpoints)."""

    # -- match
    def vote(self, path: list[Node], shared: int) -> Callable[[int], int]:
        """For the first `shared` tokens of `path`: a function giving the deepest boundary
        <= p this component accepts (0 always is)."""

    def matched(self, path: list[Node], length: int) -> Any:
        """This kind's part of a match of the first `length` tokens of `path` (`length` is a
        node end)."""

    def empty(self) -> Any:
        """This kind's part of an empty match."""

    # -- insert and split
    def prepare(self, part: Any, ntok: int) -> Any:
        """The caller's part of an insert of `ntok` tokens, checked and normalized before the
        tree changes (ValueError when malformed)."""

    def adopt(self, site: InsertSite, part: Any) -> Any:
        """Take `part` where the tree has nothing of it; return what it refused."""

    def split(self, upper: Node, lower: Node) -> None:
        """`lower` lost its first `upper.ntok` tokens to the new node `upper`."""

    # -- eviction
    def trim(self, want: int, out: list[Any]) -> int:
        """Free up to about `want` units without removing nodes (appended to `out`)."""

    def intact(self, node: Node) -> bool:
        """This component still accepts the boundary at `node`'s end."""

    def prune(self, intact: Callable[[Node], bool], out: list[Any]) -> int:
        """Another component trimmed: drop (into `out`) data whose boundary it no longer
        accepts (`intact`); how many units."""

    def forget(self, node: Node, out: list[Any]) -> int:
        """`node` left the tree: its data goes to `out`; how many units."""

    def collect(self, out: list[Any]) -> Any:
        """The freed list as this kind's value in `Freed` and `HybridInsert.refused`."""

    # -- sizes and checks
    def values(self) -> list[int]:
        """Every unit held (slots, checkpoint ids)."""

    def evictable(self, nodes: list[Node]) -> int:
        """Units an eviction could free now (O(nodes): admission estimates, tests)."""

    @staticmethod
    def stray(node: Node) -> bool:
        """`node` carries data of this kind (for a tree without it, or a namespace root)."""

    def check(self, nodes: list[Node]) -> None:
        """Recompute the ledger and registry from `nodes` (every node of the tree)."""


@dataclass(frozen=True)
class ComponentSpec:
    """One component a hybrid tree is built with: its class and its argument (SWA's window;
    None for STATE). The tree builds it (`make`) with its page size and its eviction policy's
    order; `name` is its spelling in `names.py` ("swa:4096")."""

    cls: type[TreeComponent]
    arg: int | None = None

    @property
    def kind(self) -> str:
        return self.cls.kind

    @property
    def name(self) -> str:
        return self.kind if self.arg is None else f"{self.kind}:{self.arg}"

    def make(self, page_size: int, key: Policy) -> TreeComponent:
        return self.cls(self.arg, page_size, key)

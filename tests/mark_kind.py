"""`MarkComponent`: a test-only kind the hybrid tree keeps (the tree side of a new kind).

A tag at some node ends (the shape of a per-boundary value such as a checkpoint or an encoder
output), kept in its own registry keyed by node, so the tree's `Node` needs no field for it; a
boundary is usable iff it is 0 or tagged (like STATE). No line of the tree's names it: a tree is
built with it from `ComponentSpec(MarkComponent)`, by hand (tests/cache/test_cache_tree_kind.py)
or by the engine's registry of kinds (tests/engine/test_kv_kinds_tree.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixkv.cache.hybrid.component import InsertSite
from radixkv.cache.node import Node

MARK = "mark"


class MarkComponent:
    """Tags at node ends; a boundary is usable iff it is 0 or tagged (like STATE)."""

    kind = MARK
    per_token = False

    def __init__(self, arg: int | None, page_size: int, key: Callable[[Any], Any]) -> None:
        self.page_size = page_size
        self.tags: dict[int, tuple[Node, int]] = {}  # id(node) -> (node, tag)

    @property
    def size(self) -> int:
        return len(self.tags)

    def vote(self, path: list[Node], shared: int) -> Callable[[int], int]:
        ends, pos = [0], 0
        for n in path:
            pos += n.ntok
            if pos <= shared and id(n) in self.tags:
                ends.append(pos)
        return lambda p: max(e for e in ends if e <= p)

    def matched(self, path: list[Node], length: int) -> int:
        return self.tags.get(id(path[-1]), (path[-1], -1))[1]

    def empty(self) -> int:
        return -1

    def prepare(self, part: Any, ntok: int) -> list[tuple[int, int]]:
        return list(part or ())

    def adopt(self, site: InsertSite, part: list[tuple[int, int]]) -> tuple[int, ...]:
        refused = []
        for p, tag in part:
            node = site.node_at(p) if 0 < p <= site.end and p % self.page_size == 0 else None
            if node is None or id(node) in self.tags:
                refused.append(tag)
            else:
                self.tags[id(node)] = (node, tag)
        return tuple(refused)

    def split(self, upper: Node, lower: Node) -> None:
        return None  # a tag is at lower's end, which did not move

    def trim(self, want: int, out: list[int]) -> int:
        gone = [k for k, (n, _) in self.tags.items() if n.lock == 0][:want]
        out.extend(self.tags.pop(k)[1] for k in gone)
        return len(gone)

    def intact(self, node: Node) -> bool:
        return id(node) in self.tags

    def prune(self, intact: Callable[[Node], bool], out: list[int]) -> int:
        return 0

    def forget(self, node: Node, out: list[int]) -> int:
        got = self.tags.pop(id(node), None)
        if got is None:
            return 0
        out.append(got[1])
        return 1

    def collect(self, out: list[int]) -> tuple[int, ...]:
        return tuple(out)

    def values(self) -> list[int]:
        return [tag for _, tag in self.tags.values()]

    def evictable(self, nodes: list[Node]) -> int:
        return sum(1 for n, _ in self.tags.values() if n.lock == 0)

    @staticmethod
    def stray(node: Node) -> bool:
        return False

    def check(self, nodes: list[Node]) -> None:
        live = {id(n) for n in nodes}
        assert all(k in live and n.alive for k, (n, _) in self.tags.items()), "a dead node's tag"

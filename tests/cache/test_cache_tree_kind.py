"""A new kind the hybrid tree keeps is its own component plus one registry line (issue 36, step 1).

`MarkComponent` is a test-only component: a tag at some node ends (the shape of a per-boundary
value such as a checkpoint), kept in its own registry keyed by node, so the tree's `Node` needs no
field for it. Registered with one line (`COMPONENTS["mark"] = MarkComponent`), it rides every
operation of `HybridCache` next to SWA without a change to the tree: its vote, its part of an
insert and of a match, splits, its own eviction, leaf removal and reset, and the checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from radixkv.cache import HybridCache
from radixkv.cache.hybrid.cache import COMPONENTS
from radixkv.cache.hybrid.component import InsertSite
from radixkv.cache.node import Node


class MarkComponent:
    """Tags at node ends; a boundary is usable iff it is 0 or tagged (like STATE)."""

    kind = "mark"
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


def test_a_test_only_tree_kind_rides_every_operation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(COMPONENTS, "mark", MarkComponent)  # the one registry line
    c = HybridCache(["full", "swa:4", "mark"], page_size=2)
    toks = list(range(12))
    out = c.insert(toks, list(range(12)), {"swa": list(range(100, 112)), "mark": [(8, 77)]})
    assert out.refused["mark"] == () and len(out.refused["swa"]) == 0
    c.check_integrity()
    m = c.match(toks)  # the deepest boundary SWA and the tags both accept: the tag at 8
    assert (m.length, m.kinds["mark"], m.shared_length) == (8, 77, 12)
    assert m.kinds["swa"].tolist() == [-1] * 4 + [104, 105, 106, 107]
    assert c.held("mark") == 1 and c.held_values("mark") == [77]
    dup = c.insert(toks[:8], list(range(8)), {"swa": [-1] * 8, "mark": [(8, 78), (3, 79)]})
    assert dup.refused["mark"] == (78, 79)  # a tag already there; not a page boundary
    assert c.evict({"mark": 1}).kinds["mark"] == (77,)
    assert c.match(toks).length == 0
    c.insert(toks, list(range(12)), {"swa": list(range(200, 212)), "mark": [(12, 90)]})
    freed = c.evict({"full": 100})
    assert freed.kinds["mark"] == (90,) and c.held("mark") == 0
    c.check_integrity()
    with pytest.raises(ValueError, match="exactly the data"):
        HybridCache(["full", "swa:4"]).insert(toks, list(range(12)), {"swa": toks, "mark": []})

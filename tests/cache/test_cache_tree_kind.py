"""A new kind the hybrid tree keeps is its own component and no line of the tree's (issue 36, step
1): the tree has no registry of kinds, it is built from `ComponentSpec`s.

`MarkComponent` (tests/mark_kind.py) is a test-only component: a tag at some node ends, kept in
its own registry keyed by node. Handed to the tree as `ComponentSpec(MarkComponent)` beside the
built-in names, it rides every operation of `HybridCache` next to SWA without a change to the
tree: its vote, its part of an insert and of a match, splits, its own eviction, leaf removal and
reset, and the checks. tests/engine/test_kv_kinds_tree.py adds it through the engine's registry.
"""

from __future__ import annotations

import pytest

from mark_kind import MARK, MarkComponent
from radixkv.cache import ComponentSpec, HybridCache
from radixkv.cache.hybrid.names import parse_components


def test_a_test_only_tree_kind_rides_every_operation() -> None:
    c = HybridCache(["full", "swa:4", ComponentSpec(MarkComponent)], page_size=2)
    assert c.components.names() == ("full", "swa:4", MARK)
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


def test_a_kind_without_a_name_is_refused_by_name() -> None:
    """The names are the built-in kinds' spelling only: a new kind is handed over by its spec."""
    with pytest.raises(ValueError, match=r"unknown component 'mark' \(full \| swa \| state\)"):
        parse_components(["full", "mark"])
    spec = parse_components(["full", "swa:4", ComponentSpec(MarkComponent)])
    assert spec.kinds == ("swa", MARK) and spec.get("swa") == 4 and spec.has(MARK)
    with pytest.raises(ValueError, match="named twice"):
        parse_components(["full", ComponentSpec(MarkComponent), ComponentSpec(MarkComponent)])

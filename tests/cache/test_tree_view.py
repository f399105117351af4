"""The dashboard's tree view: bounded, ancestor-closed, sizes equal to a naive recount, and no
token ids or salts in its output."""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.cache import RadixCache
from radixkv.cache.tree_view import MAX_TOP_K, namespace_label, tree_view

KEY = b"test-key"


def _build(seed: int, page: int = 1) -> tuple[RadixCache, list[tuple[str | None, list[int]]]]:
    """A random tree over a few namespaces, with some paths locked."""
    rng = random.Random(seed)
    cache = RadixCache(page_size=page)
    seqs: list[tuple[str | None, list[int]]] = []
    slot = 0
    for _ in range(rng.randint(1, 25)):
        ns = rng.choice([None, None, "tenant-secret-a", "tenant-secret-b"])
        if seqs and rng.random() < 0.7:
            _, base = rng.choice(seqs)
            base = base[: rng.randint(0, len(base))]
        else:
            base = []
        toks = base + [rng.randint(10_000, 10_999) for _ in range(rng.randint(1, 12) * page)]
        cache.insert(toks, list(range(slot, slot + len(toks))), ns)
        cache.evict(0)
        slot += len(toks)
        seqs.append((ns, toks))
    for ns, toks in rng.sample(seqs, k=min(3, len(seqs))):
        m = cache.match(toks, ns)
        cache.lock(m.handle)
    return cache, seqs


def _naive(cache: RadixCache) -> dict[int, tuple[int, int, int]]:
    """id(node) -> (depth, subtree tokens, subtree nodes), recounted from scratch."""
    out: dict[int, tuple[int, int, int]] = {}

    def visit(node: Any, depth: int) -> tuple[int, int]:
        tok, cnt = node.ntok, 1
        for c in node.children.values():
            t, n = visit(c, depth + 1)
            tok, cnt = tok + t, cnt + n
        out[id(node)] = (depth, tok, cnt)
        return tok, cnt

    for _, root in cache._roots.items():
        for c in root.children.values():
            visit(c, 1)
    return out


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), top_k=st.integers(0, 30), depth=st.integers(1, 5))
def test_tree_view_bounded_closed_and_exact(seed: int, top_k: int, depth: int) -> None:
    cache, _ = _build(seed)
    view = tree_view(cache, top_k, depth, KEY)
    naive = _naive(cache)
    assert view["total_nodes"] == len(naive)
    assert view["total_tokens"] == cache.total_size
    nodes = view["nodes"]
    eligible = sorted((-t, d) for d, t, _ in naive.values() if d <= depth)
    assert len(nodes) == min(top_k, len(eligible))
    # The listed subtree sizes are exactly the largest ones (as a multiset).
    assert sorted((-n["subtree_tokens"], n["depth"]) for n in nodes) == eligible[: len(nodes)]
    ids = {n["id"] for n in nodes}
    assert len(ids) == len(nodes)
    for n in nodes:
        assert n["depth"] <= depth
        # Ancestor-closed: a listed node's parent is listed, or it hangs off a namespace root.
        assert (n["parent"] is None) == (n["depth"] == 1)
        assert n["parent"] is None or n["parent"] in ids
        assert 0 <= n["hidden_children"] <= n["children"]
    # Namespace totals add up to the tree.
    assert sum(s["tokens"] for s in view["namespaces"]) == cache.total_size
    assert sum(s["locked_tokens"] for s in view["namespaces"]) == cache.protected_size


def json_numbers(doc: Any) -> list[float]:
    """Every number in a JSON document, and a check that no list holds numbers (a token list)."""
    out: list[float] = []
    if isinstance(doc, dict):
        for v in doc.values():
            out.extend(json_numbers(v))
    elif isinstance(doc, list):
        assert not any(isinstance(v, int | float) for v in doc), f"a list of numbers: {doc}"
        for v in doc:
            out.extend(json_numbers(v))
    elif isinstance(doc, int | float) and not isinstance(doc, bool):
        out.append(doc)
    return out


def test_tree_view_leaks_no_tokens_or_salts() -> None:
    cache, seqs = _build(7)
    view = tree_view(cache, MAX_TOP_K, 64, KEY)
    assert "tenant-secret" not in json.dumps(view)
    tokens = {t for _, s in seqs for t in s}
    # Token ids are 10,000..10,999 and no size here reaches them: none may appear as a number.
    assert cache.total_size < 10_000
    assert not tokens & set(json_numbers(view))
    assert namespace_label(KEY, "tenant-secret-a") != namespace_label(b"other", "tenant-secret-a")


def test_tree_view_ids_stable_and_keyed() -> None:
    cache, _ = _build(3)
    a = tree_view(cache, 10, 4, KEY)
    b = tree_view(cache, 10, 4, KEY)
    c = tree_view(cache, 10, 4, b"another key")
    assert [n["id"] for n in a["nodes"]] == [n["id"] for n in b["nodes"]]
    assert {n["id"] for n in a["nodes"]}.isdisjoint({n["id"] for n in c["nodes"]})


def test_tree_view_clamps_bounds() -> None:
    cache, _ = _build(1)
    view = tree_view(cache, 10**9, 10**9, KEY)
    assert view["top_k"] == MAX_TOP_K and view["max_depth"] == 64
    assert tree_view(cache, -5, -5, KEY)["nodes"] == []

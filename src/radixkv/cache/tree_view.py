"""A bounded, privacy-safe summary of a RadixCache for the dashboard (`GET /cache/tree`).

The tree holds every tenant's prompts, so nothing here ever leaves as token ids or text: a node
is named by a short keyed hash of its namespace and full token path, a namespace (tenant salt) by
a short keyed hash of its value; everything else is a size, a count or an age. The hash key is a
secret the caller chooses per process (`secrets.token_bytes`), so a short hash cannot be matched
against a dictionary of guessed prompts or salts, and stays stable from one poll to the next.

Bounds: at most `top_k` nodes (clamped to MAX_TOP_K) of depth <= `max_depth` (clamped to
MAX_DEPTH) are listed: the largest subtrees by tokens, shallower first on ties. A parent's subtree
is never smaller than its child's, so the listed set is closed under ancestors (every listed node's
parent is listed or is a namespace root) and renders as a tree. Cost: one pass over every node
(the same order as the census check), then O(top_k * depth) hashing.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
from collections.abc import Hashable
from typing import Any

from radixkv.cache.node import Node, Root

MAX_TOP_K = 500
MAX_DEPTH = 64
HASH_CHARS = 10


def short_hash(key: bytes, value: object) -> str:
    """A short keyed hash of `value` (bytes, or anything by its repr) for display."""
    data = value if isinstance(value, bytes) else repr(value).encode()
    return hmac.new(key, data, hashlib.blake2s).hexdigest()[:HASH_CHARS]


def namespace_label(key: bytes, namespace: Hashable | None) -> str:
    """`default` for the unnamed namespace, else `ns:` and a short keyed hash of the salt."""
    if namespace is None:
        return "default"
    return "ns:" + short_hash(key, b"ns\0" + repr(namespace).encode())


def session_label(key: bytes, session_id: str | None) -> str | None:
    """A client's session id as a short keyed hash (None stays None)."""
    return None if session_id is None else "s:" + short_hash(key, b"sess\0" + session_id.encode())


def request_label(key: bytes, request_id: str) -> str:
    """A request id as a short keyed hash (ids may embed client-chosen text)."""
    return "r:" + short_hash(key, b"req\0" + request_id.encode())


class _Stat:
    """Per-node figures gathered in the pass over the tree."""

    __slots__ = ("depth", "node", "ns", "prefix_tokens", "subtree_nodes", "subtree_tokens")

    def __init__(self, node: Node, ns: str, depth: int, prefix_tokens: int) -> None:
        self.node = node
        self.ns = ns
        self.depth = depth  # 1 for a child of a namespace root
        self.prefix_tokens = prefix_tokens  # tokens from the root through this node's edge
        self.subtree_tokens = node.ntok
        self.subtree_nodes = 1


def _gather(cache: Any, key: bytes) -> tuple[list[_Stat], dict[str, dict[str, int]]]:
    """Every node's stats (children after parents) and per-namespace totals."""
    stats: list[_Stat] = []
    by_node: dict[int, _Stat] = {}
    labels: dict[Hashable | None, str] = {}
    for ns, node in cache.iter_nodes():  # parents before children
        label = labels.get(ns)
        if label is None:
            label = labels[ns] = namespace_label(key, ns)
        parent = by_node.get(id(node.parent))
        if parent is None:  # a child of the namespace root
            s = _Stat(node, label, 1, node.ntok)
        else:
            s = _Stat(node, label, parent.depth + 1, parent.prefix_tokens + node.ntok)
        stats.append(s)
        by_node[id(node)] = s
    spaces: dict[str, dict[str, int]] = {
        label: {"tokens": 0, "nodes": 0, "locked_tokens": 0, "top_level_nodes": 0}
        for label in labels.values()
    }
    for s in reversed(stats):  # children after parents: fold sizes upwards
        parent = by_node.get(id(s.node.parent))
        if parent is not None:
            parent.subtree_tokens += s.subtree_tokens
            parent.subtree_nodes += s.subtree_nodes
        space = spaces[s.ns]
        space["tokens"] += s.node.ntok
        space["nodes"] += 1
        space["locked_tokens"] += s.node.ntok if s.node.lock > 0 else 0
        space["top_level_nodes"] += s.depth == 1
    return stats, spaces


def _path_hash(key: bytes, ns: str, node: Node) -> str:
    """Keyed hash of the node's namespace label and full token path (stable across polls)."""
    parts: list[bytes] = []
    cur: Node | None = node
    while cur is not None and not isinstance(cur, Root):
        parts.append(cur.key)
        cur = cur.parent
    return short_hash(key, ns.encode() + b"\0" + b"".join(reversed(parts)))


def tree_view(cache: Any, top_k: int = 40, max_depth: int = 8, key: bytes = b"") -> dict[str, Any]:
    """The dashboard's JSON for a RadixCache (see the module docstring for bounds and privacy).

    Ages are in ticks of the cache's logical clock (one tick per recorded match or insert).
    """
    top_k = max(0, min(int(top_k), MAX_TOP_K))
    max_depth = max(1, min(int(max_depth), MAX_DEPTH))
    clock = int(getattr(cache, "clock", 0))
    stats, spaces = _gather(cache, key)
    eligible = (s for s in stats if s.depth <= max_depth)
    chosen = heapq.nsmallest(top_k, eligible, key=lambda s: (-s.subtree_tokens, s.depth))
    names = {id(s.node): _path_hash(key, s.ns, s.node) for s in chosen}
    nodes = []
    for s in chosen:
        n = s.node
        listed = sum(1 for c in n.children.values() if id(c) in names)
        nodes.append(
            {
                "id": names[id(n)],
                "parent": names.get(id(n.parent)),  # None: a namespace root
                "namespace": s.ns,
                "depth": s.depth,
                "edge_tokens": n.ntok,
                "prefix_tokens": s.prefix_tokens,
                "subtree_tokens": s.subtree_tokens,
                "subtree_nodes": s.subtree_nodes,
                "children": len(n.children),
                "hidden_children": len(n.children) - listed,
                "lock": n.lock,
                "hits": n.hits,
                "priority": n.priority,
                "idle_ticks": clock - n.last_access,
                "age_ticks": clock - n.created,
            }
        )
    return {
        "kind": "radix",
        "page_size": cache.page_size,
        "clock": clock,
        "total_tokens": cache.total_size,
        "evictable_tokens": cache.evictable_size,
        "protected_tokens": cache.protected_size,
        "total_nodes": len(stats),
        "top_k": top_k,
        "max_depth": max_depth,
        "namespaces": sorted(  # largest first, like the nodes
            ({"namespace": k, **v} for k, v in spaces.items()), key=lambda s: -s["tokens"]
        ),
        "nodes": nodes,
    }

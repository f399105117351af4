"""Session references on the radix tree (SGLang-style session-aware eviction).

A session (a conversation, an agent run) holds one reference: the path of the last request it
ran. The reference is counted on every node of that path (`node.sref`, like a lock count) but
never protects anything; a session-aware policy (`session-<base>`) evicts nodes without session
references first, then those with fewer, then in its base policy's order. Closing the session
drops the reference.

Invariants (checked by `SessionTable.check`):
- every live reference is anchored at exactly one node (`ref.node`, listed in its `anchors`);
- `node.sref` == the number of references anchored at `node` or below it;
- when an anchor node is evicted (or its tail trimmed), its references move to the node that
  remains above it, so the counts on the surviving path stay right.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixkv.cache.leafqueue import LeafQueue
    from radixkv.cache.node import Node

# Clients invent session ids; past this many open references the oldest is dropped.
MAX_SESSIONS = 100_000


class SessionRef:
    """One session's reference: the deepest node of the path it holds."""

    __slots__ = ("node", "session")

    def __init__(self, session: Hashable, node: Node) -> None:
        self.session = session
        self.node = node


def _anchor(ref: SessionRef, node: Node) -> None:
    ref.node = node
    if node.anchors is None:
        node.anchors = [ref]
    else:
        node.anchors.append(ref)


def move_anchors(dead: Node, to: Node) -> None:
    """`dead` leaves the tree: its references now end at `to` (the node above it), whose
    `sref` already counts them."""
    refs = dead.anchors or []
    dead.anchors = None
    for ref in refs:
        _anchor(ref, to)


class SessionTable:
    """session id -> its reference, oldest first (bounded by `max_sessions`)."""

    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self.max_sessions = max_sessions
        self._refs: OrderedDict[Hashable, SessionRef] = OrderedDict()

    def __len__(self) -> int:
        return len(self._refs)

    def refs(self) -> list[SessionRef]:
        return list(self._refs.values())

    def hold(self, leaves: LeafQueue, session: Hashable, node: Node | None) -> None:
        """Replace `session`'s reference by one on `node`'s path (none if `node` is None).
        The new path is counted before the old one is dropped, so a shared prefix never
        dips to zero references in between."""
        old = self._refs.pop(session, None)
        if node is not None and node.parent is not None:
            ref = SessionRef(session, node)
            _anchor(ref, node)
            walk = node
            while walk.parent is not None:
                walk.sref += 1  # the key grows: monotone policies re-key lazily
                if walk.entry is not None:
                    leaves.touched(walk)
                walk = walk.parent
            self._refs[session] = ref
        if old is not None:
            _drop(leaves, old)
        while len(self._refs) > self.max_sessions:
            _drop(leaves, self._refs.popitem(last=False)[1])

    def release(self, leaves: LeafQueue, session: Hashable) -> bool:
        ref = self._refs.pop(session, None)
        if ref is None:
            return False
        _drop(leaves, ref)
        return True

    def clear(self) -> None:
        self._refs.clear()

    def check(self, nodes: list[Any]) -> None:
        """Recount every node's `sref` from the anchors (`nodes`: (namespace, node) pairs of the
        whole tree); raises AssertionError on a mismatch."""
        expect: dict[int, int] = {}
        anchored = 0
        for _, node in nodes:
            for ref in node.anchors or []:
                if ref.node is not node or self._refs.get(ref.session) is not ref:
                    raise AssertionError("cache integrity: session anchor is not its session's ref")
                anchored += 1
                walk = node
                while walk.parent is not None:
                    expect[id(walk)] = expect.get(id(walk), 0) + 1
                    walk = walk.parent
        live = sum(1 for r in self._refs.values() if r.node.parent is not None and r.node.alive)
        if anchored != live:
            raise AssertionError(f"cache integrity: {live} session refs but {anchored} anchored")
        for _, node in nodes:
            if node.sref != expect.get(id(node), 0):
                raise AssertionError(
                    f"cache integrity: node sref {node.sref} but {expect.get(id(node), 0)} "
                    "session references pass through it"
                )


def _drop(leaves: LeafQueue, ref: SessionRef) -> None:
    """Uncount `ref` along its path; evictable leaves whose key fell are re-keyed now."""
    node = ref.node
    if node.anchors is not None:
        node.anchors.remove(ref)
        if not node.anchors:
            node.anchors = None
    if not node.alive:
        return  # dropped by reset: nothing left to uncount
    while node.parent is not None:
        node.sref -= 1
        if node.entry is not None:  # a smaller key must not wait for lazy re-keying
            leaves.invalidate(node)
            leaves.push(node)
        node = node.parent

"""The node both radix trees are made of (plain and hybrid), and the edge comparison their walks
share. An edge holds a whole number of pages of tokens; per-component data (`swa`, `ckpt`) is
left at its empty value by the plain tree."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from radixkv.cache.base import SlotArray
from radixkv.cache.keys import EMPTY_SLOTS, TOKEN_BYTES

if TYPE_CHECKING:
    from radixkv.cache.leafqueue import Entry


def common_pages(q: bytes, pos: int, key: bytes, limit: int, pb: int) -> int:
    """How many whole pages of `key` match `q` at byte offset `pos` (at most `limit`), given that
    the first one does. Gallops then bisects, comparing only not-yet-compared bytes, so the cost
    is proportional to the match length, not to the edge length."""
    lo, step = 1, 1  # lo: pages known to match
    hi = limit  # pages that may match
    while lo < hi:
        probe = min(lo + step, hi)
        if q.startswith(key[lo * pb : probe * pb], pos + lo * pb):
            lo = probe
            step <<= 1
        else:
            hi = probe - 1
            break
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if q.startswith(key[lo * pb : mid * pb], pos + lo * pb):
            lo = mid
        else:
            hi = mid - 1
    return lo


class Node:
    """One edge of the tree (the root of a namespace has an empty edge and no parent)."""

    __slots__ = (
        "alive",
        "anchors",
        "born",
        "children",
        "ckpt",
        "created",
        "depth",
        "entry",
        "gap",
        "hits",
        "key",
        "kind",
        "last_access",
        "lock",
        "ntok",
        "parent",
        "priority",
        "slots",
        "sref",
        "swa",
    )

    def __init__(self, key: bytes, slots: SlotArray, parent: Node | None, clock: int) -> None:
        self.key = key  # token ids of this edge, int64 little-endian bytes
        self.slots = slots  # read-only int64 array, one slot per token of `key`
        self.ntok = len(key) // TOKEN_BYTES
        self.children: dict[bytes, Node] = {}  # first page of the child's key -> child
        self.parent = parent
        self.lock = 0
        self.last_access = clock
        self.hits = 1
        self.created = clock
        self.priority = 0
        self.entry: Entry | None = None  # live leaf-queue entry iff an evictable leaf
        self.alive = True  # False once evicted or dropped by reset: its handle is stale
        # Hybrid components (radixkv.cache.hybrid.cache): SWA slot per token (-1 = tombstone) and
        # the STATE checkpoint valid at this node's end (-1 = none). Unused by the plain cache.
        self.swa: SlotArray | None = None
        self.ckpt = -1
        # Tokens above this edge (0 for a root's children): "head blocks are worth more".
        self.depth: int = parent.depth + parent.ntok if parent is not None else 0
        # Session references through this node (counted along the path, like `lock`, but they
        # never protect: session-aware policies only evict referenced nodes later), and the
        # session references whose deepest node this is (None when there are none).
        self.sref = 0
        self.gap = 0  # policy-owned: e.g. ticks between this node's last two uses
        self.born = clock  # policy-owned: e.g. the tick its current life began
        self.kind = 0  # policy-owned: e.g. the class of its current life
        self.anchors: list[Any] | None = None


def is_lock_end(node: Node) -> bool:
    """Some handle is locked exactly at `node` (its lock count exceeds its children's sum)."""
    return node.lock > sum(c.lock for c in node.children.values())


class Root(Node):
    """The root of one namespace: an empty edge, never locked, never a leaf candidate. It exists
    only while the namespace caches something (evicting its last child drops it)."""

    __slots__ = ("namespace",)

    def __init__(self, namespace: Hashable | None, clock: int) -> None:
        super().__init__(b"", EMPTY_SLOTS, None, clock)
        self.namespace = namespace

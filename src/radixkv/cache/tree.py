"""The radix tree core both caches are built on (`RadixCache`, `HybridCache`); metadata only.

It owns what every radix tree here shares and knows nothing of components: the namespace roots,
the page-aligned walk and edge split, recency and hit bookkeeping, reference-counted locks with
the evictable / protected ledgers, the incrementally kept queue of evictable leaves, page-granular
leaf removal, session references, statistics and the core's integrity check. A subclass adds the
public match / insert / evict / reset of its contract on top of these primitives; the hybrid tree
extends `_split` to cut its per-token component arrays too.

Tree invariants (all verified by `_check_core`):
- every namespace has its own root; no node is reachable from two roots;
- every non-root edge holds a whole number (>= 1) of pages of tokens, one FULL slot per token
  (none in a tree without FULL), and a child is filed in its parent's dict under its first page;
- `node.lock >= child.lock` for every child (locks count along the path to the root);
- `evictable_size` / `protected_size` are the token sums over unlocked / locked nodes; they move
  only on 0<->1 lock transitions, on insert, on split (no change) and on evict;
- the leaf queue tracks exactly the unlocked non-root nodes without children;
- no slot is held by two nodes.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from radixkv.cache.base import CacheStats, SlotArray
from radixkv.cache.integrity import check_tree
from radixkv.cache.keys import TOKEN_BYTES, StatsLedger, concat_slots, frozen_copy
from radixkv.cache.leafqueue import LeafQueue
from radixkv.cache.node import Node, Root, common_pages
from radixkv.cache.policies import EvictionPolicy, make_policy
from radixkv.cache.sessions import SessionTable, move_anchors


def _split_slots(slots: SlotArray, at: int) -> tuple[SlotArray, SlotArray]:
    """Halves of a node's read-only slot array. If the array owns its memory, the larger half
    stays a view of it and only the smaller half is copied; a view is always copied. So every
    view is at least half of the array it keeps alive: memory held for evicted slots stays
    below the live node's own size."""
    if slots.base is not None:
        return frozen_copy(slots[:at]), frozen_copy(slots[at:])
    if 2 * at <= len(slots):
        return frozen_copy(slots[:at]), slots[at:]
    return slots[:at], frozen_copy(slots[at:])


class RadixTree:
    """Shared primitives of the radix caches (see the module docstring). Not a cache by itself.

    Policy bookkeeping: one logical clock tick per recorded match and per insert; every node on
    the touched path gets `last_access = tick` and `hits += 1` (a new node starts at one hit);
    `created` is the tick of the insert that first stored the tokens (splits inherit it).
    Handles are nodes; one whose node was evicted (never while locked) or dropped by a reset is
    stale, and `lock` / `unlock` raise ValueError on it.
    """

    #: Whether nodes carry one FULL slot per token (a hybrid tree without FULL keeps none).
    has_full: bool = True

    def __init__(self, page_size: int = 1, policy: str | EvictionPolicy = "lru") -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.policy = make_policy(policy)
        self._page_bytes = page_size * TOKEN_BYTES
        self._roots: dict[Hashable | None, Root] = {}
        self._leaves: LeafQueue = self.policy.make_queue()
        self._sessions = SessionTable()
        self._clock = 0  # policies read it (through `bind`) for ages
        self._evictable = 0
        self._protected = 0
        self._stats = StatsLedger()

    # ---------------------------------------------------------------- walk and split

    def _walk(self, root: Node, q: bytes) -> tuple[list[Node], int]:
        """Nodes on the longest page-aligned match of `q` below `root`, and its length in bytes.
        Splits the last edge if the match ends inside it."""
        pb = self._page_bytes
        end = len(q) - len(q) % pb
        node = root
        pos = 0
        path: list[Node] = []
        while pos < end:
            child = node.children.get(q[pos : pos + pb])
            if child is None:
                break
            key = child.key
            if q.startswith(key, pos):
                path.append(child)
                pos += len(key)
                node = child
                continue
            # Mismatch (or end of query) inside the edge; the first page is known to match.
            common = common_pages(q, pos, key, min(len(key), end - pos) // pb, pb) * pb
            path.append(self._split(child, common))
            pos += common
            break
        return path, pos

    def _split(self, child: Node, at: int) -> Node:
        """Cut `child`'s edge after `at` bytes (a whole number of pages, 0 < at < len(key)); the
        new upper node inherits the lock count and all policy fields, so no size changes.
        `child` keeps its identity (and any checkpoint at its end, and its session anchors)."""
        parent = child.parent
        assert parent is not None
        ntok = at // TOKEN_BYTES
        upper_slots, lower_slots = _split_slots(child.slots, ntok)
        upper = Node(child.key[:at], upper_slots, parent, child.created)
        upper.lock = child.lock
        upper.last_access = child.last_access
        upper.hits = child.hits
        upper.priority = child.priority
        upper.sref = child.sref  # every session reference through `child` passes `upper`
        upper.depth = child.depth
        upper.gap = child.gap
        upper.born = child.born
        upper.kind = child.kind
        child.depth += ntok
        parent.children[child.key[: self._page_bytes]] = upper
        child.key = child.key[at:]
        child.slots = lower_slots
        child.ntok -= ntok
        child.parent = upper
        upper.children[child.key[: self._page_bytes]] = child
        return upper

    # ---------------------------------------------------------------- touch and grow

    def _touch(self, path: list[Node], priority: int = 0) -> int:
        """One clock tick for an insert along `path`: recency, hits, and (never lowered)
        priority. Returns the tick."""
        self._clock += 1
        clock = self._clock
        for node in path:
            node.last_access = clock
            node.hits += 1
            if priority > node.priority:
                node.priority = priority
        return clock

    def _record_match(self, path: list[Node], length: int) -> None:
        """A recorded match of `path` (non-empty) covering `length` tokens: one clock tick, the
        policy hears it, recency and hits move, and the matched tokens count as hits."""
        self._clock += 1
        clock = self._clock
        self.policy.on_match(path, clock)
        for node in path:
            node.last_access = clock
            node.hits += 1
        last = path[-1]
        if last.entry is not None:
            self._leaves.touched(last)
        self._stats.matched_tokens += length

    def _add_leaf(self, parent: Node, key: bytes, slots: SlotArray, priority: int) -> Node:
        """File a new unlocked leaf under `parent` at the current tick (slots: read-only)."""
        leaf = Node(key, slots, parent, self._clock)
        leaf.priority = priority
        self.policy.on_insert(leaf)
        if parent.entry is not None:
            self._leaves.invalidate(parent)
        parent.children[key[: self._page_bytes]] = leaf
        self._leaves.push(leaf)
        self._evictable += leaf.ntok
        self._stats.inserted_tokens += leaf.ntok
        return leaf

    def _root_for_insert(self, namespace: Hashable | None, end: int) -> Root | None:
        """The namespace's root, created on the first insert of at least a page (else None)."""
        root = self._roots.get(namespace)
        if root is None and end:
            root = self._roots[namespace] = Root(namespace, self._clock)
        return root

    # ---------------------------------------------------------------- locks

    def lock(self, handle: Any) -> None:
        """Protect the handle's path to the root from eviction (reference counted)."""
        if handle is None:
            return
        node = self._live(handle)
        while node.parent is not None:
            if node.lock == 0:
                self._evictable -= node.ntok
                self._protected += node.ntok
                if node.entry is not None:
                    self._leaves.invalidate(node)
            node.lock += 1
            node = node.parent

    def unlock(self, handle: Any) -> None:
        """Undo one `lock(handle)`; unlocking a path that is not locked raises ValueError."""
        if handle is None:
            return
        node = self._live(handle)
        if node.parent is not None and node.lock <= 0:
            raise ValueError("unlock of a handle that is not locked")
        while node.parent is not None:
            node.lock -= 1
            if node.lock == 0:
                self._evictable += node.ntok
                self._protected -= node.ntok
                if not node.children:
                    self._leaves.push(node)
            node = node.parent

    @staticmethod
    def _live(handle: Any) -> Node:
        if not isinstance(handle, Node):
            raise TypeError(f"not a radix tree handle: {handle!r}")
        if not handle.alive:
            raise ValueError("stale handle: its node was evicted or the cache was reset")
        return handle

    def slots_of(self, handle: Any) -> SlotArray:
        """The FULL slots of the prefix `handle` covers, in token order (a fresh array)."""
        if handle is None:
            return concat_slots([])
        parts = []
        node: Node | None = self._live(handle)
        while node is not None and node.parent is not None:
            parts.append(node.slots)
            node = node.parent
        parts.reverse()
        return concat_slots(parts)

    # ---------------------------------------------------------------- eviction

    def _pop_victim(self, need: int) -> Node | None:
        """The next evictable leaf in policy order, or None. Page-granular: when it holds more
        whole pages than the `need`ed tokens, its edge is cut and only the tail (the original
        node, so a stale handle to it dies) is returned; the head, a new node with the leaf's
        policy fields, becomes a candidate once the tail is removed."""
        node = self._leaves.pop()
        if node is None:
            return None
        page = self.page_size
        need = -(-need // page) * page
        if need < node.ntok:
            self._split(node, (node.ntok - need) * TOKEN_BYTES)
        return node

    def _remove_leaf(self, node: Node) -> None:
        """Take an unlocked, untracked leaf out of the tree (its data is the caller's to free):
        its session references move to the parent, the parent becomes a candidate when this
        was its last child, and an emptied namespace is dropped."""
        parent = node.parent
        assert parent is not None
        del parent.children[node.key[: self._page_bytes]]
        node.parent = None
        node.alive = False
        self._evictable -= node.ntok
        self._stats.evicted_tokens += node.ntok
        if node.anchors:  # its session references now end at the parent
            move_anchors(node, parent)
        self.policy.on_evict(node)
        if parent.children:
            return
        if parent.parent is not None:
            if parent.lock == 0:
                self._leaves.push(parent)
        elif isinstance(parent, Root):  # an emptied namespace keeps nothing alive
            del self._roots[parent.namespace]

    def _drop_all(self) -> list[Node]:
        """Reset the core: every node dies (locks included, their handles become stale) and
        the list of them is returned for the subclass to collect their data."""
        nodes = [node for _, node in self.iter_nodes()]
        for node in nodes:
            node.alive = False
            node.entry = None
        self._roots.clear()
        self._leaves.clear()
        self._sessions.clear()
        self.policy.on_reset()
        self._evictable = 0
        self._protected = 0
        return nodes

    # ---------------------------------------------------------------- sessions

    def hold_session(self, session: Hashable, handle: Any) -> None:
        """Session `session` now references the handle's path (replacing its previous one):
        session-aware policies evict unreferenced nodes first, then less referenced ones. A
        reference never protects anything; `None` just drops the previous reference."""
        node = self._live(handle) if handle is not None else None
        self._sessions.hold(self._leaves, session, node)

    def release_session(self, session: Hashable) -> bool:
        """Drop the session's reference (on close); False if it held none."""
        return self._sessions.release(self._leaves, session)

    @property
    def open_sessions(self) -> int:
        return len(self._sessions)

    # ---------------------------------------------------------------- sizes, stats, checks

    @property
    def clock(self) -> int:
        """The logical clock: one tick per recorded match and per insert."""
        return self._clock

    @property
    def evictable_size(self) -> int:
        return self._evictable

    @property
    def protected_size(self) -> int:
        return self._protected

    @property
    def total_size(self) -> int:
        return self._evictable + self._protected

    def stats(self) -> CacheStats:
        return self._stats.snapshot()

    def reset_stats(self) -> None:
        self._stats = StatsLedger()

    def namespaces(self) -> list[Hashable | None]:
        return list(self._roots)

    def iter_nodes(self) -> list[tuple[Hashable | None, Node]]:
        """Every non-root node with its namespace, parents before children."""
        out: list[tuple[Hashable | None, Node]] = []
        for ns, root in self._roots.items():
            stack = list(root.children.values())
            while stack:
                node = stack.pop()
                out.append((ns, node))
                stack.extend(node.children.values())
        return out

    def cached_slots(self) -> SlotArray:
        """Every FULL slot the tree holds (for census checks: free + cached + held == pool)."""
        return concat_slots([node.slots for _, node in self.iter_nodes()])

    def _check_core(self) -> None:
        """Verify the core's invariants (module docstring); AssertionError names the first
        violation."""
        check_tree(
            self._roots,
            self._leaves,
            self.policy,
            self.page_size,
            self.has_full,
            (self._evictable, self._protected),
        )
        self._sessions.check(self.iter_nodes())

"""RadixCache: a page-aligned, namespaced radix tree mapping token prefixes to KV slot indices.

Metadata only (never imports torch, never frees memory): the caller frees every slot array that
`evict` or `reset` returns, and the duplicate slots `insert` reports.

Tree invariants (all verified by `check_integrity`):
- every namespace has its own root; no node is reachable from two roots;
- every non-root edge holds a whole number (>= 1) of pages of tokens and exactly one slot per token,
  and a child is filed in its parent's dict under its first page;
- `node.lock >= child.lock` for every child (locks count along the path to the root);
- `evictable_size` / `protected_size` are the token sums over unlocked / locked nodes; they move
  only on 0<->1 lock transitions, on insert, on split (no change) and on evict;
- the leaf queue tracks exactly the unlocked non-root nodes without children;
- no slot is held by two nodes.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any

from radixkv.cache.base import CacheStats, MatchResult, SlotArray
from radixkv.cache.components import Components
from radixkv.cache.hybrid_api import ComponentMethods
from radixkv.cache.keys import (
    TOKEN_BYTES,
    StatsLedger,
    concat_slots,
    frozen_copy,
    slot_array,
    token_key,
)
from radixkv.cache.leafqueue import LeafQueue
from radixkv.cache.policies import EvictionPolicy, make_policy
from radixkv.cache.radix_node import Node, Root, common_pages
from radixkv.cache.sessions import SessionTable, move_anchors

if TYPE_CHECKING:
    from radixkv.cache.hybrid import ComponentOps


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


class RadixCache(ComponentMethods):
    """Radix-tree prefix cache; see the module docstring for invariants and DESIGN.md for the
    contract.

    Tokens may be numpy int arrays (fastest: one memcpy into the key), lists or tuples of ints.
    Every slot array returned (by `match`, `evict`, `reset`) is a fresh int64 array the caller
    owns. Handles belong to the cache that issued them; a handle whose node was evicted (never
    while locked) or dropped by `reset` is stale and `lock`/`unlock` raise ValueError on it.

    Policy bookkeeping: one logical clock tick per recorded match and per insert; every node on
    the touched path gets `last_access = tick` and `hits += 1` (a new node starts at one hit);
    `created` is the tick of the insert that first stored the tokens (splits inherit it).
    """

    def __init__(
        self,
        page_size: int = 1,
        policy: str | EvictionPolicy = "lru",
        components: Components | Sequence[str] | None = None,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.policy = make_policy(policy)
        self._page_bytes = page_size * TOKEN_BYTES
        self._roots: dict[Hashable | None, Root] = {}
        self._leaves: LeafQueue = self.policy.make_queue()
        self._sessions = SessionTable()
        self._clock = 0
        self._evictable = 0
        self._protected = 0
        self._stats = StatsLedger()
        # Hybrid components (SWA, STATE, no FULL) live in radixkv.cache.hybrid; the FULL-only
        # cache keeps `_hy = None` and never enters that code.
        self.components = Components.parse(components)
        self._hy: ComponentOps | None = None
        if self.components.hybrid:
            from radixkv.cache.hybrid import ComponentOps

            self._hy = ComponentOps(self, self.components)
        self.policy.bind(self)

    # ---------------------------------------------------------------- lookup

    def match(
        self,
        tokens: Sequence[int] | SlotArray,
        namespace: Hashable | None = None,
        *,
        record: bool = True,
    ) -> MatchResult:
        """Longest cached prefix of `tokens` in `namespace`, floored to whole pages.

        A match ending inside an edge splits it, so `handle` (the deepest matched node, or None
        for an empty match) covers exactly the matched prefix. `record=False` is a peek: no hit
        statistics, no recency or hit-count change (it may still split an edge, which changes no
        size and no eviction order).
        """
        if self._hy is not None:
            return self._hy.match(tokens, namespace, record)
        q = token_key(tokens)
        if record:
            self._stats.match_calls += 1
            self._stats.requested_tokens += len(q) // TOKEN_BYTES
        root = self._roots.get(namespace)
        if root is None:
            return MatchResult(0, concat_slots([]), None)
        path, matched = self._walk(root, q)
        if not path:
            return MatchResult(0, concat_slots([]), None)
        length = matched // TOKEN_BYTES
        if record:
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
        return MatchResult(length, concat_slots([n.slots for n in path]), path[-1])

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
        new upper node inherits the lock count and all policy fields, so no size changes."""
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
        if self._hy is not None:
            self._hy.on_split(upper, child, ntok)
        return upper

    # ---------------------------------------------------------------- insert

    def insert(
        self,
        tokens: Sequence[int] | SlotArray,
        slots: Sequence[int] | SlotArray,
        namespace: Hashable | None = None,
        priority: int = 0,
    ) -> int:
        """Insert the page-floored prefix of `tokens` with their KV `slots`; return how many
        leading tokens were already cached (a multiple of the page size).

        Ownership: the tree keeps its own slots for the already-cached range and adopts
        `slots[returned:floored_len]` for the new tail. For the range the caller had itself
        matched and locked (length L), `slots[:L]` ARE the tree's slots (not duplicates); the
        caller frees only `slots[L:returned]` (computed twice) and, itself, the partial-page tail
        `slots[floored_len:]`, which the tree never takes. `priority` raises (never lowers) the
        priority of every node on the path (used by the "priority" policy).
        """
        if self._hy is not None:
            raise RuntimeError("a hybrid cache takes insert_components (every component's data)")
        q = token_key(tokens)
        n = len(q) // TOKEN_BYTES
        s = slot_array(slots, n)
        stats = self._stats
        stats.insert_calls += 1
        end = len(q) - len(q) % self._page_bytes
        root = self._roots.get(namespace)
        if root is None:
            if not end:
                return 0
            root = self._roots[namespace] = Root(namespace, self._clock)
        path, pos = self._walk(root, q)
        self._clock += 1
        clock = self._clock
        for node in path:
            node.last_access = clock
            node.hits += 1
            if priority > node.priority:
                node.priority = priority
        parent = path[-1] if path else root
        if pos < end:
            start_tok, end_tok = pos // TOKEN_BYTES, end // TOKEN_BYTES
            leaf = Node(q[pos:end], frozen_copy(s[start_tok:end_tok]), parent, clock)
            leaf.priority = priority
            self.policy.on_insert(leaf)
            if parent.entry is not None:
                self._leaves.invalidate(parent)
            parent.children[q[pos : pos + self._page_bytes]] = leaf
            self._leaves.push(leaf)
            self._evictable += leaf.ntok
            stats.inserted_tokens += leaf.ntok
        elif parent.entry is not None:
            self._leaves.touched(parent)
        return pos // TOKEN_BYTES

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
            raise TypeError(f"not a RadixCache handle: {handle!r}")
        if not handle.alive:
            raise ValueError("stale handle: its node was evicted or the cache was reset")
        return handle

    # ---------------------------------------------------------------- eviction

    def evict(self, num_tokens: int) -> SlotArray:
        """Free unlocked cached pages, leaf by leaf in policy order, until at least `num_tokens`
        tokens are freed or nothing is evictable; a parent becomes a candidate when its last
        child goes. Page-granular: when the chosen leaf holds more whole pages than are still
        needed, only its tail pages go (the leaf is split and its head stays cached, keeping
        its policy fields). Returns the freed slots (the caller frees them). O(log n) per
        evicted leaf."""
        if self._hy is not None:
            raise RuntimeError("a hybrid cache frees through evict_components")
        freed: list[SlotArray] = []
        count = 0
        leaves = self._leaves
        pb = self._page_bytes
        page = self.page_size
        policy = self.policy
        while count < num_tokens:
            node = leaves.pop()
            if node is None:
                break
            need = -(-(num_tokens - count) // page) * page  # whole pages still needed
            if need < node.ntok:
                node = self._trim(node, node.ntok - need)
            parent = node.parent
            del parent.children[node.key[:pb]]
            node.parent = None
            node.alive = False
            freed.append(node.slots)
            count += node.ntok
            if node.anchors:  # its session references now end at the parent
                move_anchors(node, parent)
            policy.on_evict(node)
            if parent.children:
                continue
            if parent.parent is not None:
                if parent.lock == 0:
                    leaves.push(parent)
            elif isinstance(parent, Root):  # an emptied namespace keeps nothing alive
                del self._roots[parent.namespace]
        self._evictable -= count
        self._stats.evicted_tokens += count
        return concat_slots(freed)

    def _trim(self, leaf: Node, keep: int) -> Node:
        """Split an unlocked, untracked leaf after its first `keep` tokens (whole pages) and
        return the tail, the original node, for eviction (so a stale handle to it dies). The
        head is a new node with the leaf's policy fields; `evict` tracks it as a leaf once the
        tail is gone, like any parent whose last child went."""
        self._split(leaf, keep * TOKEN_BYTES)
        return leaf

    # ---------------------------------------------------------------- sessions

    def hold_session(self, session: Hashable, handle: Any) -> None:
        """Session `session` now references the handle's path (replacing its previous one):
        session-aware policies evict unreferenced nodes first, then less referenced ones. A
        reference never protects anything; `None` just drops the previous reference."""
        node = self._live(handle) if handle is not None else None
        self._sessions.hold(self, session, node)

    def release_session(self, session: Hashable) -> bool:
        """Drop the session's reference (on close); False if it held none."""
        return self._sessions.release(self, session)

    @property
    def open_sessions(self) -> int:
        return len(self._sessions)

    # ---------------------------------------------------------------- sizes, stats, reset

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
        """Every slot the tree holds (for census checks: free + cached + held == pool)."""
        return concat_slots([node.slots for _, node in self.iter_nodes()])

    def reset(self) -> SlotArray:
        """Drop every node, locks included (their handles become stale) and return all the
        slots the tree held, for the caller to free. Statistics are cumulative and survive;
        call `reset_stats` for fresh counters."""
        if self._hy is not None:
            raise RuntimeError("a hybrid cache frees through reset_components")
        parts = []
        for _, node in self.iter_nodes():
            node.alive = False
            node.entry = None
            parts.append(node.slots)
        self._roots.clear()
        self._leaves.clear()
        self._sessions.clear()
        self.policy.on_reset()
        self._evictable = 0
        self._protected = 0
        return concat_slots(parts)

    def check_integrity(self) -> None:
        """Verify every tree invariant; raises AssertionError naming the first violation."""
        from radixkv.cache.integrity import check_radix

        check_radix(self)
        if self._hy is not None:
            from radixkv.cache.hybrid_check import check_components

            check_components(self, self._hy)

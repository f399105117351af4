"""HybridCache: the radix tree of a hybrid model (FULL and the tree's other components: SWA,
STATE, ...); metadata only.

Built on the same tree core as the plain `RadixCache` (`radixkv.cache.tree`: walk, split, locks,
leaf queue, page-granular leaf removal, namespaces, sessions) and on one object per other
component (`TreeComponent`, component.py: SWA in `swa.py`, STATE in `state.py`), each holding
its own ledger and rules, built from the `ComponentSpec`s the tree is given (`Components`: by
the engine's registry of kinds, or by name, `names.py`). The tree iterates them in its order and
never names one. Like vLLM's hybrid KV-cache coordinator, a match walks the cached path once and
every component votes on the candidate boundaries; the request resumes from the deepest one all
accept. Per-node data (see node.Node): `slots` FULL slot per token (empty when the model has no
FULL layers), `swa` SWA slot per token (-1 tombstone), `ckpt` STATE checkpoint at the node's
end. Eviction (`evict({kind: n})`, `reset`) is `evict.py`'s: trims first, then leaves.
`FULL` sizes (`evictable_size`, `total_size`, `cached_slots`) count FULL tokens as in the plain
tree; `held(kind)` is every other component's ledger.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from radixkv.cache.base import SlotArray
from radixkv.cache.hybrid.component import ComponentSpec, InsertSite, TreeComponent
from radixkv.cache.hybrid.components import Components, Freed, HybridInsert, HybridMatch
from radixkv.cache.hybrid.evict import ComponentEviction
from radixkv.cache.hybrid.names import BUILTIN, parse_components
from radixkv.cache.keys import (
    EMPTY_SLOTS,
    TOKEN_BYTES,
    concat_slots,
    frozen_copy,
    slot_array,
    token_key,
)
from radixkv.cache.node import Node, common_pages
from radixkv.cache.policies import EvictionPolicy
from radixkv.cache.tree import RadixTree


class HybridCache(RadixTree):
    """A radix tree whose nodes hold every component of a hybrid model (module docstring)."""

    def __init__(
        self,
        components: Components | Sequence[str | ComponentSpec],
        page_size: int = 1,
        policy: str | EvictionPolicy = "lru",
    ) -> None:
        """`components`: a `Components`, or names such as ("full", "swa:4096", "state") (any of
        them a `ComponentSpec`, `names.parse_components`)."""
        super().__init__(page_size, policy)
        self.components = parse_components(components)
        if not self.components.hybrid:
            raise ValueError("a FULL-only cache is a RadixCache")
        self.has_full = self.components.full
        key = self.policy.key
        comps = [spec.make(page_size, key) for spec in self.components.parts]
        self.parts: tuple[TreeComponent, ...] = tuple(comps)
        self._by_kind = {c.kind: c for c in comps}
        self._kinds = frozenset(self._by_kind)
        if not self.has_full and not any(c.per_token for c in comps):
            raise ValueError("a cache needs FULL or a per-token component such as SWA")
        self._eviction = ComponentEviction(
            comps, self.has_full, self._pop_victim, self._remove_leaf
        )
        self.policy.bind(self)

    def component(self, kind: str) -> TreeComponent | None:
        """The component keeping `kind` (None: this tree has none)."""
        return self._by_kind.get(kind)

    # ---------------------------------------------------------------- match

    def _walk_nosplit(self, root: Node, q: bytes) -> tuple[list[Node], int]:
        """Nodes along the longest page-aligned match (the last one maybe partly) and its length
        in bytes; nothing is split."""
        pb = self._page_bytes
        end = len(q) - len(q) % pb
        node, pos = root, 0
        path: list[Node] = []
        while pos < end:
            child = node.children.get(q[pos : pos + pb])
            if child is None:
                break
            path.append(child)
            if q.startswith(child.key, pos):
                pos += len(child.key)
                node = child
                continue
            pos += common_pages(q, pos, child.key, min(len(child.key), end - pos) // pb, pb) * pb
            break
        return path, pos

    def _vote(self, path: list[Node], shared: int) -> int:
        """The deepest boundary <= `shared` (tokens) every component accepts: each gives the
        deepest it accepts at or before the last candidate, until none moves it (each answer
        is the deepest it accepts, so no common boundary is ever skipped)."""
        deepest = [c.vote(path, shared) for c in self.parts]
        p = deepest[0](shared)
        if len(deepest) == 1:
            return p
        while True:
            q = p
            for d in deepest:
                q = d(q)
            if q == p:
                return p
            p = q

    def _empty_match(self, shared: int = 0) -> HybridMatch:
        kinds = {c.kind: c.empty() for c in self.parts}
        return HybridMatch(0, concat_slots([]), None, kinds, shared)

    def match(
        self,
        tokens: Sequence[int] | SlotArray,
        namespace: Hashable | None = None,
        *,
        record: bool = True,
    ) -> HybridMatch:
        """The deepest page boundary on the cached path of `tokens` that every component
        accepts; the edge it falls inside is split, so `handle` covers exactly the match.
        `record=False` is a peek (no statistics, no recency)."""
        q = token_key(tokens)
        if record:
            self._stats.match_calls += 1
            self._stats.requested_tokens += len(q) // TOKEN_BYTES
        root = self._roots.get(namespace)
        if root is None:
            return self._empty_match()
        path, shared_b = self._walk_nosplit(root, q)
        shared = shared_b // TOKEN_BYTES
        p = self._vote(path, shared)
        if p == 0:
            return self._empty_match(shared)
        kept: list[Node] = []  # the path cut at p (splitting the edge p falls inside)
        pos = 0
        for n in path:
            if pos + n.ntok <= p:
                kept.append(n)
                pos += n.ntok
                if pos == p:
                    break
                continue
            kept.append(self._split(n, (p - pos) * TOKEN_BYTES))
            break
        if record:
            self._record_match(kept, p)
        handle = kept[-1]
        full = concat_slots([n.slots for n in kept]) if self.has_full else concat_slots([])
        kinds = {c.kind: c.matched(kept, p) for c in self.parts}
        return HybridMatch(p, full, handle, kinds, shared)

    def peek_full(
        self, tokens: Sequence[int] | SlotArray, namespace: Hashable | None = None
    ) -> tuple[int, SlotArray, Any]:
        """The cached path of `tokens` before any vote: its page-aligned length, the FULL slots
        of those tokens, and a handle whose lock protects them (its node may reach past the
        length). Nothing is split or recorded (the tiers continue a match from here)."""
        root = self._roots.get(namespace)
        if root is None:
            return 0, concat_slots([]), None
        path, shared_b = self._walk_nosplit(root, token_key(tokens))
        shared = shared_b // TOKEN_BYTES
        if not path or not self.has_full:
            return shared, concat_slots([]), path[-1] if path else None
        return shared, concat_slots([n.slots for n in path])[:shared], path[-1]

    def part_of(self, kind: str, handle: Any) -> Any:
        """What a match of exactly the prefix `handle` covers gives `kind` (SWA: its slots, -1
        before its window; None without the kind); with `slots_of`, what a request reads after
        moving its lock to `handle`."""
        comp = self._by_kind.get(kind)
        if comp is None:
            return None
        path: list[Node] = []
        node: Node | None = self._live(handle) if handle is not None else None
        while node is not None and node.parent is not None:
            path.append(node)
            node = node.parent
        if not path:
            return comp.empty()
        path.reverse()
        return comp.matched(path, sum(n.ntok for n in path))

    # ---------------------------------------------------------------- split and insert

    def _split(self, child: Node, at: int) -> Node:
        """The core's split; every component moves its data with the tokens."""
        upper = super()._split(child, at)
        for c in self.parts:
            c.split(upper, child)
        return upper

    def insert(
        self,
        tokens: Sequence[int] | SlotArray,
        slots: Sequence[int] | SlotArray | None,
        parts: Mapping[str, Any] | None = None,
        namespace: Hashable | None = None,
        priority: int = 0,
        owned_from: int = 0,
    ) -> HybridInsert:
        """Insert every component's data for the page-floored prefix of `tokens`: FULL `slots`
        (None without FULL) and `parts[kind]`, each kind's part: SWA one slot per token (-1
        where the caller already freed it; required), STATE (boundary, checkpoint id) pairs (a
        boundary must be a whole number of pages within the inserted prefix). Positions <
        `owned_from` are the caller's locked match (the tree's own data); for positions >=
        owned_from the tree adopts SWA slots where it has tombstones. See HybridInsert for what
        the caller must free."""
        q = token_key(tokens)
        n = len(q) // TOKEN_BYTES
        parts = parts or {}
        if (slots is None) == self.has_full or not parts.keys() <= self._kinds:
            raise ValueError(f"insert needs exactly the data of {self.components.names()}")
        full = slot_array(slots, n) if slots is not None else None
        mine = [(c, c.prepare(parts.get(c.kind), n)) for c in self.parts]
        self._stats.insert_calls += 1
        end = len(q) - len(q) % self._page_bytes
        end_tok = end // TOKEN_BYTES
        root = self._root_for_insert(namespace, end)
        if root is None:  # nothing to insert: the caller keeps all its data
            site = InsertSite([], None, 0, 0, owned_from, lambda p: None)
            return HybridInsert(0, None, {c.kind: c.adopt(site, part) for c, part in mine})
        path, pos = self._walk(root, q)
        pos_tok = pos // TOKEN_BYTES
        if pos_tok < owned_from and pos_tok < end_tok:
            raise RuntimeError(f"tree lost a locked prefix: found {pos_tok} < owned {owned_from}")
        self._touch(path, priority)
        handle: Node | None = path[-1] if path else None
        leaf = None
        if pos < end:
            leaf_slots = frozen_copy(full[pos_tok:end_tok]) if full is not None else EMPTY_SLOTS
            handle = leaf = self._add_leaf(
                path[-1] if path else root, q[pos:end], leaf_slots, priority
            )
        elif handle is not None and handle.entry is not None:
            self._leaves.touched(handle)
        site = InsertSite(path, leaf, pos_tok, end_tok, owned_from, self._node_at(root, q))
        # In the tree's order: per-token data is on the new leaf before a later split cuts it.
        refused = {c.kind: c.adopt(site, part) for c, part in mine}
        return HybridInsert(pos_tok, handle, refused)

    def _node_at(self, root: Node, q: bytes) -> Callable[[int], Node | None]:
        """The node of `q`'s path ending exactly at boundary p (tokens), splitting there."""

        def at(p: int) -> Node | None:
            path, pos = self._walk(root, q[: p * TOKEN_BYTES])
            return path[-1] if path and pos // TOKEN_BYTES == p else None

        return at

    # ---------------------------------------------------------------- eviction and reset

    def evict(self, want: Mapping[str, int]) -> Freed:
        """Free at least `want[kind]` of each kind where possible (FULL tokens, SWA slots,
        checkpoints; kinds this tree lacks are ignored): every asked component trims first
        (the others pruning what that broke), then unlocked leaves go in policy order (freeing
        every component they hold) while FULL or a per-token component is short (evict.py);
        the caller frees what comes back."""
        return self._eviction.evict(want)

    def reset(self) -> Freed:
        """Drop every node, locks included (their handles become stale), and return every
        component's data the tree held, for the caller to free."""
        return self._eviction.drop(self._drop_all())

    # ---------------------------------------------------------------- sizes and checks

    def held(self, kind: str) -> int:
        """Units of `kind` the tree holds (SWA slots, checkpoints; 0 without the kind)."""
        comp = self._by_kind.get(kind)
        return comp.size if comp is not None else 0

    def held_values(self, kind: str) -> list[int]:
        """The values of `kind` the tree holds (its slots or checkpoint ids)."""
        comp = self._by_kind.get(kind)
        return comp.values() if comp is not None else []

    def evictable(self, kind: str) -> int:
        """Units of `kind` eviction could free now (O(nodes); admission estimates, tests)."""
        comp = self._by_kind.get(kind)
        return comp.evictable([n for _, n in self.iter_nodes()]) if comp is not None else 0

    def check_integrity(self) -> None:
        """Verify the core's and every component's invariants (AssertionError on the first
        violation)."""
        self._check_core()
        nodes = [n for _, n in self.iter_nodes()]
        for c in self.parts:
            c.check(nodes)
        # The built-in kinds keep their data on Node's own fields: none on a tree without them
        # (a kind keeping its data in its own registry cannot stray), none on a namespace root.
        absent = [(kind, cls) for kind, cls in BUILTIN.items() if kind not in self._by_kind]
        for kind, cls in absent:
            if any(cls.stray(n) for n in nodes):
                raise AssertionError(f"component integrity: {kind} data without its component")
        for stray in [c.stray for c in self.parts] + [cls.stray for _, cls in absent]:
            if any(stray(root) for root in self._roots.values()):
                raise AssertionError("component integrity: a namespace root carries data")

"""HybridCache: the radix tree of a hybrid model (FULL + SWA + STATE components); metadata only.

Built on the same tree core as the plain `RadixCache` (`radixkv.cache.tree`: walk, split, locks,
leaf queue, page-granular leaf removal, namespaces, sessions) and on one object per extra
component (`swa.SwaComponent`, `state.StateComponent`), which hold their own ledgers and rules.
Like vLLM's hybrid KV-cache coordinator, a match walks the cached path once and every component
votes on the candidate boundaries; the request resumes from the deepest one all accept.
Per-node data (see node.Node): `slots` FULL slot per token (empty when the model has no FULL
layers), `swa` SWA slot per token (-1 tombstone), `ckpt` STATE checkpoint at the node's end.

Eviction: SWA K/V outside every kept boundary's window first, page by page, only as many pages as
asked and the furthest back first (tombstones; checkpoints whose window that breaks are dropped),
then checkpoints by policy, then unlocked leaves in policy order through the core's page-granular
removal (tail pages only while FULL alone is short), freeing every component they hold. When SWA
is still short after trimming, every leaf holds no more than its own last window, so a victim leaf
goes whole: cutting its tail would leave no usable boundary in it.
`FULL` sizes (`evictable_size`, `total_size`, `cached_slots`) count FULL
tokens as in the plain tree; `swa_size` and `checkpoint_count` are the other components' ledgers.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from radixkv.cache.base import SlotArray
from radixkv.cache.hybrid.components import Components, Freed, HybridInsert, HybridMatch
from radixkv.cache.hybrid.state import StateComponent
from radixkv.cache.hybrid.swa import SwaComponent
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

_ALL = 1 << 62  # "no page-granular limit": a victim leaf goes whole


class HybridCache(RadixTree):
    """A radix tree whose nodes hold every component of a hybrid model (module docstring)."""

    def __init__(
        self,
        components: Components | Sequence[str],
        page_size: int = 1,
        policy: str | EvictionPolicy = "lru",
    ) -> None:
        """`components`: a `Components`, or names such as ("full", "swa:4096", "state")."""
        super().__init__(page_size, policy)
        self.components = Components.parse(components)
        if not self.components.hybrid:
            raise ValueError("a FULL-only cache is a RadixCache")
        self.has_full = self.components.full
        window = self.components.swa_window
        key = self.policy.key
        self.swa = SwaComponent(window, page_size, key) if window is not None else None
        self.state = StateComponent(key) if self.components.state else None
        self.policy.bind(self)

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
        """The deepest boundary <= `shared` (tokens) every component accepts."""
        swa = self.swa
        tombs = swa.tombstones(path, shared) if swa is not None else []
        if self.state is not None:
            ends = self.state.boundaries(path, shared)
            return next(p for p in reversed(ends) if swa is None or swa.accepts(tombs, p))
        return swa.deepest(tombs, shared) if swa is not None else shared

    def _empty_match(self, shared: int = 0) -> HybridMatch:
        swa = concat_slots([]) if self.swa is not None else None
        return HybridMatch(0, concat_slots([]), None, swa, -1, shared)

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
        swa = self.swa.window_slots(kept, p) if self.swa is not None else None
        return HybridMatch(p, full, handle, swa, handle.ckpt, shared)

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

    def swa_slots_of(self, handle: Any) -> SlotArray | None:
        """The SWA slots of the prefix `handle` covers, -1 before its window (None without
        SWA); with `slots_of`, what a request reads after moving its lock to `handle`."""
        if self.swa is None:
            return None
        path: list[Node] = []
        node: Node | None = self._live(handle) if handle is not None else None
        while node is not None and node.parent is not None:
            path.append(node)
            node = node.parent
        path.reverse()
        return self.swa.window_slots(path, sum(n.ntok for n in path))

    # ---------------------------------------------------------------- split and insert

    def _split(self, child: Node, at: int) -> Node:
        """The core's split, cutting the SWA array too (a checkpoint stays with `child`, the
        lower part: it is valid at child's end)."""
        upper = super()._split(child, at)
        if self.swa is not None:
            self.swa.on_split(upper, child, upper.ntok)
        return upper

    def insert(
        self,
        tokens: Sequence[int] | SlotArray,
        slots: Sequence[int] | SlotArray | None,
        swa: Sequence[int] | SlotArray | None = None,
        checkpoints: Sequence[tuple[int, int]] = (),
        namespace: Hashable | None = None,
        priority: int = 0,
        owned_from: int = 0,
    ) -> HybridInsert:
        """Insert every component's data for the page-floored prefix of `tokens`: FULL `slots`
        (None without FULL), per-token `swa` slots (-1 where the caller already freed them),
        and STATE `checkpoints` as (boundary, checkpoint id) pairs (a boundary must be a whole
        number of pages within the inserted prefix). Positions < `owned_from` are the caller's
        locked match (the tree's own data); for positions >= owned_from the tree adopts SWA
        slots where it has tombstones. See HybridInsert for what the caller must free."""
        q = token_key(tokens)
        n = len(q) // TOKEN_BYTES
        if (slots is None) == self.has_full or (swa is None) == (self.swa is not None):
            raise ValueError(f"insert needs exactly the data of {self.components.names()}")
        full = slot_array(slots, n) if slots is not None else None
        swa_arr = slot_array(swa, n) if swa is not None else None
        self._stats.insert_calls += 1
        end = len(q) - len(q) % self._page_bytes
        end_tok = end // TOKEN_BYTES
        root = self._root_for_insert(namespace, end)
        if root is None:  # nothing to insert: the caller keeps all its slots
            return HybridInsert(0, None, concat_slots([]), tuple(c for _, c in checkpoints))
        path, pos = self._walk(root, q)
        pos_tok = pos // TOKEN_BYTES
        if pos_tok < owned_from and pos_tok < end_tok:
            raise RuntimeError(f"tree lost a locked prefix: found {pos_tok} < owned {owned_from}")
        self._touch(path, priority)
        swa_free = concat_slots([])
        if self.swa is not None and swa_arr is not None:
            swa_free = self.swa.revive(path, swa_arr, owned_from)
        handle: Node | None = path[-1] if path else None
        if pos < end:
            leaf_slots = frozen_copy(full[pos_tok:end_tok]) if full is not None else EMPTY_SLOTS
            handle = self._add_leaf(path[-1] if path else root, q[pos:end], leaf_slots, priority)
            if self.swa is not None and swa_arr is not None:
                self.swa.adopt_leaf(handle, swa_arr[pos_tok:end_tok])
        elif handle is not None and handle.entry is not None:
            self._leaves.touched(handle)
        rejected = self._attach_checkpoints(root, q, end_tok, checkpoints)
        return HybridInsert(pos_tok, handle, swa_free, rejected)

    def _attach_checkpoints(
        self, root: Node, q: bytes, end_tok: int, checkpoints: Sequence[tuple[int, int]]
    ) -> tuple[int, ...]:
        rejected: list[int] = []
        ps = self.page_size
        for p, cid in checkpoints:
            if self.state is None or p <= 0 or p > end_tok or p % ps:
                rejected.append(cid)
                continue
            path, pos = self._walk(root, q[: p * TOKEN_BYTES])
            if pos // TOKEN_BYTES != p or not self.state.attach(path[-1], cid):
                rejected.append(cid)
        return tuple(rejected)

    # ---------------------------------------------------------------- eviction and reset

    def evict(self, full_tokens: int = 0, swa_slots: int = 0, checkpoints: int = 0) -> Freed:
        """Free at least the asked amounts where possible: SWA K/V outside every kept window
        first (tombstones), then unlocked checkpoints in policy order, then unlocked leaves in
        policy order (freeing every component they hold) while FULL or SWA is short; the
        caller frees what comes back."""
        swa_parts: list[SlotArray] = []
        ckpts: list[int] = []
        got_swa = self._trim(swa_slots, swa_parts, ckpts) if swa_slots > 0 else 0
        if self.state is not None and len(ckpts) < checkpoints:
            self.state.drop(checkpoints - len(ckpts), ckpts)
        full_parts: list[SlotArray] = []
        got_full = 0
        while got_full < full_tokens or got_swa < swa_slots:
            # Page-granular while FULL alone is short; a leaf goes whole when SWA is.
            need = full_tokens - got_full if got_swa >= swa_slots else _ALL
            node = self._pop_victim(need)
            if node is None:
                break
            self._remove_leaf(node)
            if self.has_full:
                full_parts.append(node.slots)
                got_full += node.ntok
            got_swa += self._forget(node, swa_parts, ckpts)
        if got_swa < swa_slots:  # removed leaves turned branch points into pass-through nodes
            got_swa += self._trim(swa_slots - got_swa, swa_parts, ckpts)
        return Freed(concat_slots(full_parts), concat_slots(swa_parts), tuple(ckpts))

    def _trim(self, want: int, swa_parts: list[SlotArray], ckpts: list[int]) -> int:
        """SWA trimming, then the checkpoints it left without a window."""
        if self.swa is None:
            return 0
        got = self.swa.trim(want, swa_parts)
        if got and self.state is not None:
            self.state.drop_blind(self.swa.window_intact, ckpts)
        return got

    def _forget(self, node: Node, swa_parts: list[SlotArray], ckpts: list[int]) -> int:
        """A removed node's SWA slots and checkpoint into the freed lists; SWA count."""
        if self.state is not None:
            self.state.forget(node, ckpts)
        return self.swa.forget(node, swa_parts) if self.swa is not None else 0

    def reset(self) -> Freed:
        """Drop every node, locks included (their handles become stale), and return every
        component's data the tree held, for the caller to free."""
        nodes = self._drop_all()
        full = concat_slots([n.slots for n in nodes]) if self.has_full else concat_slots([])
        swa_parts: list[SlotArray] = []
        ckpts: list[int] = []
        for n in nodes:
            self._forget(n, swa_parts, ckpts)
        return Freed(full, concat_slots(swa_parts), tuple(ckpts))

    # ---------------------------------------------------------------- sizes and checks

    @property
    def swa_size(self) -> int:
        """Live SWA slots held by the tree (0 without an SWA component)."""
        return self.swa.size if self.swa is not None else 0

    @property
    def checkpoint_count(self) -> int:
        """STATE checkpoints held by the tree."""
        return len(self.state) if self.state is not None else 0

    def cached_checkpoints(self) -> list[int]:
        return self.state.ids() if self.state is not None else []

    def evictable_swa(self) -> int:
        """Live SWA entries eviction could free now (O(nodes); admission estimates, tests)."""
        nodes = [n for _, n in self.iter_nodes()]
        return self.swa.evictable(nodes) if self.swa is not None else 0

    def check_integrity(self) -> None:
        """Verify the core's and every component's invariants (AssertionError on the first
        violation)."""
        self._check_core()
        nodes = [n for _, n in self.iter_nodes()]
        if self.swa is not None:
            self.swa.check(nodes)
        elif any(n.swa is not None for n in nodes):
            raise AssertionError("component integrity: SWA slots without an SWA component")
        if self.state is not None:
            self.state.check(nodes)
        elif any(n.ckpt >= 0 for n in nodes):
            raise AssertionError("component integrity: checkpoint without a STATE component")
        for root in self._roots.values():
            if root.swa is not None or root.ckpt >= 0:
                raise AssertionError("component integrity: a namespace root carries data")

"""Component logic of the radix tree for hybrid models (FULL + SWA + STATE); metadata only.

`ComponentOps` is attached to a RadixCache built with hybrid `Components`; the tree core (walk,
split, locks, leaf queue, namespaces) stays RadixCache's, and this module adds per-component
match votes, insert, split and eviction. Per-node data (see radix_node.Node):
  `slots` FULL slot per token (empty when the model has no FULL layers),
  `swa`   SWA slot per token, TOMBSTONE (-1) where the K/V was freed,
  `ckpt`  STATE checkpoint id valid exactly at the node's end, or -1.

Invariants (checked by `check`):
- tombstones are whole pages; `swa_size` == live SWA entries in the tree; no slot twice;
- the checkpoint registry holds exactly the nodes with `ckpt >= 0`; no checkpoint id twice;
- `swa_nodes` holds exactly the nodes with live SWA entries;
- trimming (phase 1 of SWA eviction) keeps the window before every *kept boundary*: the end of a
  leaf, of a branching node, and of a node some handle is locked at (lock > the sum of its
  children's locks). Ends of pass-through nodes (e.g. where a running request committed a prefill
  chunk) lose their windows, so a long locked prompt holds about W tokens of SWA, not W per
  chunk. A locked request's resume point is a kept boundary, so trimming never breaks a locked
  window. A checkpoint whose window trimming broke can never be resumed from and is dropped.
- a checkpoint at a node some handle is locked at is never dropped (its request copies it at
  admission); others are dropped by policy or when their window is trimmed.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from radixkv.cache.base import MatchResult, SlotArray
from radixkv.cache.components import Components, InsertOutcome
from radixkv.cache.hybrid_evict import ComponentEviction, _frozen
from radixkv.cache.keys import EMPTY_SLOTS, TOKEN_BYTES, concat_slots, frozen_copy, slot_array
from radixkv.cache.radix_node import Node, Root, common_pages

if TYPE_CHECKING:
    from radixkv.cache.radix import RadixCache


class ComponentOps(ComponentEviction):
    """Per-component behaviour of one RadixCache (see the module docstring)."""

    def __init__(self, cache: RadixCache, components: Components) -> None:
        self.cache = cache
        self.comp = components
        self.window = components.swa_window
        self.swa_size = 0  # live SWA entries held by the tree
        self.ckpts: dict[int, Node] = {}  # id(node) -> node with ckpt >= 0
        self.swa_nodes: dict[int, Node] = {}  # id(node) -> node with live SWA entries
        self.dropped: list[int] = []  # checkpoints freed during the current eviction

    # ---------------------------------------------------------------- match

    def _walk_nosplit(self, root: Node, q: bytes) -> tuple[list[Node], int]:
        """Nodes along the longest page-aligned match (the last one maybe partly) and its length
        in bytes; nothing is split."""
        pb = self.cache._page_bytes
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

    def vote(self, path: list[Node], shared: int) -> int:
        """The deepest boundary <= `shared` (tokens) every component accepts."""
        ps = self.cache.page_size
        tombs: list[int] = []
        if self.window is not None and path:
            swa = np.concatenate([n.swa for n in path if n.swa is not None])[:shared]
            tombs = np.flatnonzero(swa < 0).tolist()
        w = self.window or 0

        def swa_ok(p: int) -> bool:
            i = bisect.bisect_left(tombs, p)
            return i == 0 or tombs[i - 1] < p - w

        if self.comp.state:
            ends, pos = [0], 0
            for n in path:
                pos += n.ntok
                if pos <= shared and n.ckpt >= 0:
                    ends.append(pos)
            return next(p for p in reversed(ends) if swa_ok(p))
        p = shared
        while not swa_ok(p):
            t = tombs[bisect.bisect_left(tombs, p) - 1]
            p = t - t % ps
        return p

    def match(self, tokens: object, namespace: Hashable | None, record: bool) -> MatchResult:
        from radixkv.cache.keys import token_key

        c = self.cache
        q = token_key(tokens)
        if record:
            c._stats.match_calls += 1
            c._stats.requested_tokens += len(q) // TOKEN_BYTES
        root = c._roots.get(namespace)
        if root is None:
            return self._empty_match()
        path, shared_b = self._walk_nosplit(root, q)
        shared = shared_b // TOKEN_BYTES
        p = self.vote(path, shared)
        if p == 0:
            return self._empty_match(shared)
        # Cut the path at p (splitting the edge p falls inside).
        kept: list[Node] = []
        pos = 0
        for n in path:
            if pos + n.ntok <= p:
                kept.append(n)
                pos += n.ntok
                if pos == p:
                    break
                continue
            kept.append(c._split(n, (p - pos) * TOKEN_BYTES))
            break
        handle = kept[-1]
        if record:
            c._clock += 1
            c.policy.on_match(kept, c._clock)
            for n in kept:
                n.last_access = c._clock
                n.hits += 1
            if handle.entry is not None:
                c._leaves.touched(handle)
            c._stats.matched_tokens += p
        full = concat_slots([n.slots for n in kept]) if self.comp.full else concat_slots([])
        swa = None
        if self.window is not None:
            swa = concat_slots([n.swa for n in kept])  # type: ignore[misc]
            swa[: max(0, p - self.window)] = -1
        ckpt = handle.ckpt if self.comp.state else -1
        return MatchResult(p, full, handle, swa, ckpt, shared)

    def path_match(self, tokens: object, namespace: Hashable | None) -> MatchResult:
        """The whole page-aligned cached prefix with no vote (a request re-locking the path it
        just inserted); a peek: no statistics, no recency."""
        from radixkv.cache.keys import token_key

        c = self.cache
        root = c._roots.get(namespace)
        if root is None:
            return self._empty_match()
        path, pos = c._walk(root, token_key(tokens))
        p = pos // TOKEN_BYTES
        if not path:
            return self._empty_match()
        full = concat_slots([n.slots for n in path]) if self.comp.full else concat_slots([])
        swa = None
        if self.window is not None:
            swa = concat_slots([n.swa for n in path if n.swa is not None])
            swa[: max(0, p - self.window)] = -1
        handle = path[-1]
        return MatchResult(p, full, handle, swa, handle.ckpt, p)

    def _empty_match(self, shared: int = 0) -> MatchResult:
        swa = concat_slots([]) if self.window is not None else None
        return MatchResult(0, concat_slots([]), None, swa, -1, shared)

    # ---------------------------------------------------------------- split

    def on_split(self, upper: Node, lower: Node, ntok: int) -> None:
        """`lower` lost its first `ntok` tokens to the new `upper`; the checkpoint stays with
        `lower` (it is valid at lower's end)."""
        if self.window is not None:
            swa = lower.swa
            assert swa is not None
            upper.swa = frozen_copy(swa[:ntok])
            lower.swa = frozen_copy(swa[ntok:])
            self._track(upper)
            self._track(lower)

    # ---------------------------------------------------------------- insert

    def insert(
        self,
        tokens: object,
        slots: Sequence[int] | SlotArray | None,
        swa: Sequence[int] | SlotArray | None,
        checkpoints: Sequence[tuple[int, int]],
        namespace: Hashable | None,
        priority: int,
        owned_from: int,
    ) -> InsertOutcome:
        from radixkv.cache.keys import token_key

        c = self.cache
        q = token_key(tokens)
        n = len(q) // TOKEN_BYTES
        if (slots is None) == self.comp.full or (swa is None) == (self.window is not None):
            raise ValueError(f"insert_components needs exactly the data of {self.comp.names()}")
        full = slot_array(slots, n) if slots is not None else None
        swa_arr = slot_array(swa, n) if swa is not None else None
        c._stats.insert_calls += 1
        end = len(q) - len(q) % c._page_bytes
        end_tok = end // TOKEN_BYTES
        root = c._roots.get(namespace)
        if root is None:
            if not end:  # nothing to insert: the caller keeps all its slots
                return InsertOutcome(0, concat_slots([]), tuple(c for _, c in checkpoints))
            root = c._roots[namespace] = Root(namespace, c._clock)
        path, pos = c._walk(root, q)
        pos_tok = pos // TOKEN_BYTES
        if pos_tok < owned_from and pos_tok < end_tok:
            raise RuntimeError(f"tree lost a locked prefix: found {pos_tok} < owned {owned_from}")
        c._clock += 1
        for node in path:
            node.last_access = c._clock
            node.hits += 1
            node.priority = max(node.priority, priority)
        swa_free = self._revive(path, swa_arr, owned_from)
        parent = path[-1] if path else root
        if pos < end:
            leaf = Node(
                q[pos:end],
                frozen_copy(full[pos_tok:end_tok]) if full is not None else EMPTY_SLOTS,
                parent,
                c._clock,
            )
            leaf.priority = priority
            c.policy.on_insert(leaf)
            if swa_arr is not None:
                leaf.swa = frozen_copy(swa_arr[pos_tok:end_tok])
                self.swa_size += int((leaf.swa >= 0).sum())
                self._track(leaf)
            if parent.entry is not None:
                c._leaves.invalidate(parent)
            parent.children[q[pos : pos + c._page_bytes]] = leaf
            c._leaves.push(leaf)
            c._evictable += leaf.ntok
            c._stats.inserted_tokens += leaf.ntok
        elif parent.entry is not None:
            c._leaves.touched(parent)
        rejected = self._attach_checkpoints(root, q, end_tok, checkpoints)
        return InsertOutcome(pos_tok, swa_free, rejected)

    def _revive(self, path: list[Node], swa: SlotArray | None, owned_from: int) -> SlotArray:
        """For the already-cached range: adopt the caller's SWA slots where the tree has
        tombstones (positions >= owned_from only); return the caller's others (duplicates)."""
        if swa is None:
            return concat_slots([])
        dup: list[SlotArray] = []
        pos = 0
        for node in path:
            lo = max(owned_from, pos) - pos
            if lo < node.ntok:
                assert node.swa is not None
                mine = swa[pos + lo : pos + node.ntok]
                take = (node.swa[lo:] < 0) & (mine >= 0)
                if take.any():
                    new = node.swa.copy()
                    new[lo:][take] = mine[take]
                    node.swa = _frozen(new)
                    self.swa_size += int(take.sum())
                    self._track(node)
                rest = mine[~take]
                dup.append(rest[rest >= 0])
            pos += node.ntok
        return concat_slots(dup)

    def _attach_checkpoints(
        self, root: Node, q: bytes, end_tok: int, checkpoints: Sequence[tuple[int, int]]
    ) -> tuple[int, ...]:
        rejected: list[int] = []
        ps = self.cache.page_size
        for p, cid in checkpoints:
            if not self.comp.state or p <= 0 or p > end_tok or p % ps:
                rejected.append(cid)
                continue
            path, pos = self.cache._walk(root, q[: p * TOKEN_BYTES])
            node = path[-1]
            if pos // TOKEN_BYTES != p or node.ckpt >= 0:
                rejected.append(cid)
                continue
            node.ckpt = cid
            self.ckpts[id(node)] = node
        return tuple(rejected)

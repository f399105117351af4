"""RadixCache: a page-aligned, namespaced radix tree mapping token prefixes to KV slot indices.

The plain (FULL-only) cache and the fast path: match, insert, evict and reset of the
`PrefixCache` contract on the shared tree core (`radixkv.cache.tree`, which lists the tree
invariants). Metadata only (never imports torch, never frees memory): the caller frees every slot
array that `evict` or `reset` returns, and the duplicate slots `insert` reports.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from radixkv.cache.base import InsertResult, MatchResult, SlotArray
from radixkv.cache.keys import TOKEN_BYTES, concat_slots, frozen_copy, slot_array, token_key
from radixkv.cache.node import Root
from radixkv.cache.policies import EvictionPolicy
from radixkv.cache.tree import RadixTree

# Builds an InsertResult without the NamedTuple's Python-level __new__ (half the cost per insert).
_result = tuple.__new__


class RadixCache(RadixTree):
    """Radix-tree prefix cache; see `radixkv.cache.tree` for invariants and bookkeeping and
    DESIGN.md for the contract.

    Tokens may be numpy int arrays (fastest: one memcpy into the key), lists or tuples of ints.
    Every slot array returned (by `match`, `evict`, `reset`) is a fresh int64 array the caller
    owns. Handles belong to the cache that issued them.
    """

    def __init__(self, page_size: int = 1, policy: str | EvictionPolicy = "lru") -> None:
        super().__init__(page_size, policy)
        self.policy.bind(self)

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
            self._record_match(path, length)
        return MatchResult(length, concat_slots([n.slots for n in path]), path[-1])

    def insert(
        self,
        tokens: Sequence[int] | SlotArray,
        slots: Sequence[int] | SlotArray,
        namespace: Hashable | None = None,
        priority: int = 0,
    ) -> InsertResult:
        """Insert the page-floored prefix of `tokens` with their KV `slots`; return how many
        leading tokens were already cached (a multiple of the page size) and a handle covering
        exactly the page-floored prefix (lock it to protect what was just inserted).

        Ownership: the tree keeps its own slots for the already-cached range and adopts
        `slots[cached:floored_len]` for the new tail. For the range the caller had itself
        matched and locked (length L), `slots[:L]` ARE the tree's slots (not duplicates); the
        caller frees only `slots[L:cached]` (computed twice) and, itself, the partial-page tail
        `slots[floored_len:]`, which the tree never takes. `priority` raises (never lowers) the
        priority of every node on the path (used by the "priority" policy).
        """
        q = token_key(tokens)
        n = len(q) // TOKEN_BYTES
        s = slot_array(slots, n)
        self._stats.insert_calls += 1
        end = len(q) - len(q) % self._page_bytes
        root = self._roots.get(namespace)
        if root is None:
            if not end:
                return _result(InsertResult, (0, None))
            root = self._roots[namespace] = Root(namespace, self._clock)
        path, pos = self._walk(root, q)
        self._clock += 1  # the core's `_touch`, inlined on this hot path
        clock = self._clock
        for node in path:
            node.last_access = clock
            node.hits += 1
            if priority > node.priority:
                node.priority = priority
        cached = pos // TOKEN_BYTES
        if pos < end:
            leaf_slots = frozen_copy(s[cached : end // TOKEN_BYTES])
            leaf = self._add_leaf(path[-1] if path else root, q[pos:end], leaf_slots, priority)
            return _result(InsertResult, (cached, leaf))
        if not path:
            return _result(InsertResult, (0, None))
        last = path[-1]
        if last.entry is not None:
            self._leaves.touched(last)
        return _result(InsertResult, (cached, last))

    def evict(self, num_tokens: int) -> SlotArray:
        """Free unlocked cached pages, leaf by leaf in policy order, until at least `num_tokens`
        tokens are freed or nothing is evictable; a parent becomes a candidate when its last
        child goes. Page-granular: when the chosen leaf holds more whole pages than are still
        needed, only its tail pages go (the leaf is split and its head stays cached, keeping
        its policy fields). Returns the freed slots (the caller frees them). O(log n) per
        evicted leaf."""
        freed: list[SlotArray] = []
        count = 0
        while count < num_tokens:
            node = self._pop_victim(num_tokens - count)
            if node is None:
                break
            self._remove_leaf(node)
            freed.append(node.slots)
            count += node.ntok
        return concat_slots(freed)

    def reset(self) -> SlotArray:
        """Drop every node, locks included (their handles become stale) and return all the
        slots the tree held, for the caller to free. Statistics are cumulative and survive;
        call `reset_stats` for fresh counters."""
        return concat_slots([node.slots for node in self._drop_all()])

    def check_integrity(self) -> None:
        """Verify every tree invariant; raises AssertionError naming the first violation."""
        self._check_core()

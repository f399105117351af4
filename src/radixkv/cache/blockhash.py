"""BlockHashCache: the vLLM-style peer design (chained block hashes + an LRU free queue).

Every FULL block of `page_size` tokens is filed under the key ``(parent key id, block tokens)``:
the id of the previous block's entry (or of the namespace's root for the first block) chained
with the block's own tokens. A dict lookup on that tuple hashes it and then compares it exactly,
so the chain is a collision-free "hash of the previous block's key and its tokens", and the
namespace is part of every key through the root id.

Invariants (verified by `check_integrity`):
- a block is in the free queue iff its reference count is 0; a referenced block's ancestors are
  referenced too (lock references a whole matched chain);
- the free queue is ordered so that every unreferenced block comes AFTER all of its unreferenced
  descendants (chains are touched deepest-first), hence its front never has cached children and
  eviction is an O(1) pop of the least recently used evictable block;
- `num_children` counts the cached blocks chained directly to a block; no slot is held twice.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any

from radixkv.cache.base import CacheStats, InsertResult, MatchResult, SlotArray
from radixkv.cache.integrity import check_blockhash
from radixkv.cache.keys import (
    TOKEN_BYTES,
    StatsLedger,
    concat_slots,
    frozen_copy,
    slot_array,
    token_key,
)


class Block:
    """One cached full page: its chained key, its slots, and its place in the chain."""

    __slots__ = (
        "alive",
        "block_id",
        "created",
        "hits",
        "key",
        "last_access",
        "namespace",
        "num_children",
        "parent",
        "priority",
        "ref",
        "slots",
    )

    def __init__(
        self,
        block_id: int,
        key: tuple[int, bytes],
        slots: SlotArray,
        parent: Block | None,
        namespace: Hashable | None,
        clock: int,
    ) -> None:
        self.block_id = block_id
        self.key = key
        self.slots = slots
        self.parent = parent
        self.namespace = namespace
        self.ref = 0
        self.num_children = 0
        self.alive = True
        self.last_access = clock
        self.created = clock
        self.hits = 1
        self.priority = 0


class BlockHashCache:
    """Chained-block-hash prefix cache with the same interface as RadixCache. The handle of a
    match is the tuple of matched blocks. Only the "lru" policy exists for this design (its
    eviction order is the free queue's)."""

    def __init__(self, page_size: int = 16, policy: str = "lru") -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if policy != "lru":
            raise ValueError(f"BlockHashCache supports only the 'lru' policy, not {policy!r}")
        self.page_size = page_size
        self.policy = policy
        self._page_bytes = page_size * TOKEN_BYTES
        self._ids = itertools.count()
        self._roots: dict[Hashable | None, int] = {}  # namespace -> root id, while it has blocks
        self._first_blocks: dict[int, int] = {}  # root id -> cached blocks chained to it
        self._blocks: dict[tuple[int, bytes], Block] = {}
        # block_id -> block for every unreferenced block, least recently used first.
        self._free: OrderedDict[int, Block] = OrderedDict()
        self._clock = 0
        self._stats = StatsLedger()

    def _chain(self, q: bytes, root_id: int) -> tuple[list[Block], int]:
        """Cached blocks of the longest full-block prefix of `q`, and its end in bytes."""
        pb = self._page_bytes
        end = len(q) - len(q) % pb
        get = self._blocks.get
        parent_id = root_id
        chain: list[Block] = []
        pos = 0
        while pos < end:
            block = get((parent_id, q[pos : pos + pb]))
            if block is None:
                break
            chain.append(block)
            parent_id = block.block_id
            pos += pb
        return chain, pos

    def _touch(self, chain: list[Block], priority: int = 0) -> None:
        """Mark a chain used; deepest first, so parents land behind children in the queue."""
        self._clock += 1
        clock = self._clock
        free = self._free
        for block in reversed(chain):
            block.last_access = clock
            block.hits += 1
            if priority > block.priority:
                block.priority = priority
            if block.ref == 0:
                free.move_to_end(block.block_id)

    def match(
        self,
        tokens: Sequence[int] | SlotArray,
        namespace: Hashable | None = None,
        *,
        record: bool = True,
    ) -> MatchResult:
        """Longest cached full-block prefix; `record=False` is a peek (no stats, no recency)."""
        q = token_key(tokens)
        if record:
            self._stats.match_calls += 1
            self._stats.requested_tokens += len(q) // TOKEN_BYTES
        root_id = self._roots.get(namespace)
        if root_id is None:
            return MatchResult(0, concat_slots([]), None)
        chain, pos = self._chain(q, root_id)
        if not chain:
            return MatchResult(0, concat_slots([]), None)
        if record:
            self._touch(chain)
            self._stats.matched_tokens += pos // TOKEN_BYTES
        return MatchResult(pos // TOKEN_BYTES, concat_slots([b.slots for b in chain]), tuple(chain))

    def insert(
        self,
        tokens: Sequence[int] | SlotArray,
        slots: Sequence[int] | SlotArray,
        namespace: Hashable | None = None,
        priority: int = 0,
    ) -> InsertResult:
        """Cache every full block of `tokens`; return how many leading tokens were cached
        already and a handle to the whole chain of full blocks. Same slot ownership as
        `RadixCache.insert`: the cache adopts the caller's slots only for the new blocks; the
        partial last block stays the caller's."""
        q = token_key(tokens)
        n = len(q) // TOKEN_BYTES
        s = slot_array(slots, n)
        self._stats.insert_calls += 1
        pb, page = self._page_bytes, self.page_size
        end = len(q) - len(q) % pb
        root_id = self._roots.get(namespace)
        if root_id is None:
            if not end:
                return InsertResult(0, None)
            root_id = self._roots[namespace] = next(self._ids)
            self._first_blocks[root_id] = 0
        chain, pos = self._chain(q, root_id)
        cached = pos // TOKEN_BYTES
        parent = chain[-1] if chain else None
        first_new = len(chain)
        # One private copy for all new blocks; each block holds a read-only view of its page.
        tail = frozen_copy(s[cached : end // TOKEN_BYTES])
        blocks, free, ids, clock = self._blocks, self._free, self._ids, self._clock + 1
        parent_id = parent.block_id if parent is not None else root_id
        for off in range(0, end - pos, pb):
            key = (parent_id, q[pos + off : pos + off + pb])
            tok = off // TOKEN_BYTES
            block = Block(next(ids), key, tail[tok : tok + page], parent, namespace, clock)
            block.priority = priority
            if parent is not None:
                parent.num_children += 1
            else:
                self._first_blocks[root_id] += 1
            blocks[key] = block
            free[block.block_id] = block
            chain.append(block)
            parent, parent_id = block, block.block_id
        self._touch(chain, priority)
        self._stats.inserted_tokens += (len(chain) - first_new) * page
        return InsertResult(cached, tuple(chain) if chain else None)

    def slots_of(self, handle: Any) -> SlotArray:
        """The slots of the chain `handle` covers, in token order (a fresh array)."""
        if handle is None:
            return concat_slots([])
        return concat_slots([b.slots for b in self._live(handle)])

    def lock(self, handle: Any) -> None:
        """Reference every block of the handle's chain."""
        if handle is None:
            return
        chain = self._live(handle)
        free = self._free
        for block in chain:
            if block.ref == 0:
                del free[block.block_id]
            block.ref += 1

    def unlock(self, handle: Any) -> None:
        """Drop one reference per block, deepest first; unreferencing below zero raises."""
        if handle is None:
            return
        chain = self._live(handle)
        if chain[-1].ref <= 0:
            raise ValueError("unlock of a handle that is not locked")
        free = self._free
        for block in reversed(chain):
            block.ref -= 1
            if block.ref == 0:
                free[block.block_id] = block

    @staticmethod
    def _live(handle: Any) -> tuple[Block, ...]:
        if not isinstance(handle, tuple) or not handle or not isinstance(handle[-1], Block):
            raise TypeError(f"not a BlockHashCache handle: {handle!r}")
        # Blocks with cached children are never evicted, so the deepest block alive => all are.
        if not handle[-1].alive:
            raise ValueError("stale handle: its blocks were evicted or the cache was reset")
        return handle

    def evict(self, num_tokens: int) -> SlotArray:
        """Pop least recently used unreferenced blocks (never one with cached children) until
        `num_tokens` are freed or none is left; returns their slots for the caller to free."""
        freed: list[SlotArray] = []
        free = self._free
        count = 0
        while count < num_tokens and free:
            _, block = free.popitem(last=False)
            if block.num_children:
                raise AssertionError("free-queue order broken: front block has children")
            del self._blocks[block.key]
            if block.parent is not None:
                block.parent.num_children -= 1
            else:
                self._drop_first_block(block)
            block.alive = False
            block.parent = None
            freed.append(block.slots)
            count += self.page_size
        self._stats.evicted_tokens += count
        return concat_slots(freed)

    def _drop_first_block(self, block: Block) -> None:
        """A namespace whose last first-block goes is forgotten (it keeps nothing alive)."""
        root_id = block.key[0]
        self._first_blocks[root_id] -= 1
        if not self._first_blocks[root_id]:
            del self._first_blocks[root_id]
            del self._roots[block.namespace]

    @property
    def evictable_size(self) -> int:
        return len(self._free) * self.page_size

    @property
    def protected_size(self) -> int:
        return (len(self._blocks) - len(self._free)) * self.page_size

    @property
    def total_size(self) -> int:
        return len(self._blocks) * self.page_size

    def stats(self) -> CacheStats:
        return self._stats.snapshot()

    def reset_stats(self) -> None:
        self._stats = StatsLedger()

    def cached_slots(self) -> SlotArray:
        """Every slot the cache holds (for census checks: free + cached + held == pool)."""
        return concat_slots([block.slots for block in self._blocks.values()])

    def reset(self) -> SlotArray:
        """Drop every block (references included) and return all their slots; stats survive."""
        parts = []
        for block in self._blocks.values():
            block.alive = False
            parts.append(block.slots)
        self._blocks.clear()
        self._free.clear()
        self._roots.clear()
        self._first_blocks.clear()
        return concat_slots(parts)

    def check_integrity(self) -> None:
        """Verify every invariant (module docstring); AssertionError names the first one
        broken."""
        check_blockhash(
            self._roots,
            self._blocks,
            self._free,
            self._first_blocks,
            self.page_size,
            (self.evictable_size, self.protected_size),
        )

"""Hypothesis state machine over match/insert/lock/unlock/evict/reset for both cache designs.

After every step: `check_integrity()`, and slot conservation: every slot ever handed to `insert`
is, exactly once, either held by the cache, returned by `evict`/`reset`, reported as a duplicate
by `insert` (the range it says was already cached, minus what the caller itself had matched),
or kept by the caller as a partial-page tail the cache never takes.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixkv.cache import BlockHashCache, RadixCache, available_policies

NAMESPACES: list[Hashable | None] = [None, "lora-1", 7]
tokens_st = st.lists(st.integers(0, 2), max_size=20)


class CacheMachine(RuleBasedStateMachine):
    """Shared rules; subclasses build the cache in `setup`."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: Any = None
        self.page = 1
        self.next_slot = 0
        self.issued: set[int] = set()
        self.returned: list[int] = []  # freed via evict/reset, duplicates, partial tails
        self.seqs: list[tuple[list[int], Hashable | None]] = [([], None)]
        # (handle, tokens, namespace, matched slots) for each outstanding lock
        self.locked: list[tuple[Any, list[int], Hashable | None, list[int]]] = []

    def fresh(self, n: int) -> list[int]:
        out = list(range(self.next_slot, self.next_slot + n))
        self.next_slot += n
        self.issued.update(out)
        return out

    def query(self, data: st.DataObject) -> tuple[list[int], Hashable | None]:
        base, ns = data.draw(st.sampled_from(self.seqs[-20:]))
        cut = data.draw(st.integers(0, len(base)))
        ns = data.draw(st.sampled_from([ns, *NAMESPACES]))
        return base[:cut] + data.draw(tokens_st), ns

    def account_insert(self, slots: list[int], got: int, own: int) -> None:
        """The caller frees slots[own:got] (recomputed duplicates) and the partial tail."""
        floor = len(slots) - len(slots) % self.page
        assert got % self.page == 0 and own <= got <= floor
        self.returned.extend(slots[own:got])
        self.returned.extend(slots[floor:])

    @rule(data=st.data(), priority=st.integers(0, 2))
    def insert(self, data: st.DataObject, priority: int) -> None:
        toks, ns = self.query(data)
        slots = self.fresh(len(toks))
        got = self.cache.insert(np.array(toks, dtype=np.int64), slots, ns, priority=priority)
        self.account_insert(slots, got, 0)
        self.seqs.append((toks, ns))

    @rule(data=st.data(), record=st.booleans(), lock=st.booleans())
    def match(self, data: st.DataObject, record: bool, lock: bool) -> None:
        toks, ns = self.query(data)
        res = self.cache.match(toks, ns, record=record)
        assert res.length % self.page == 0 and len(res.slots) == res.length
        again = self.cache.match(toks, ns, record=False)
        assert list(again.slots) == list(res.slots), "a peek changed the answer"
        if lock and res.length:
            self.cache.lock(res.handle)
            self.locked.append((res.handle, toks[: res.length], ns, list(res.slots)))

    @precondition(lambda self: self.locked)
    @rule(data=st.data())
    def finish_request(self, data: st.DataObject) -> None:
        """The engine's pattern: extend a locked match, insert with the tree's own slots for the
        matched range plus fresh ones, check the tree kept its slots, then unlock."""
        handle, toks, ns, own = self.locked.pop(data.draw(st.integers(0, len(self.locked) - 1)))
        full = toks + data.draw(tokens_st)
        slots = own + self.fresh(len(full) - len(own))
        got = self.cache.insert(full, slots, ns)
        assert got >= len(own)
        assert list(self.cache.match(full, ns, record=False).slots[: len(own)]) == own
        self.account_insert(slots, got, len(own))
        self.cache.unlock(handle)
        self.seqs.append((full, ns))

    @precondition(lambda self: self.locked)
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        handle = self.locked.pop(data.draw(st.integers(0, len(self.locked) - 1)))[0]
        self.cache.unlock(handle)

    @precondition(lambda self: not self.locked and self.cache.total_size)
    @rule(data=st.data())
    def unlock_unlocked_raises(self, data: st.DataObject) -> None:
        toks, ns = data.draw(st.sampled_from(self.seqs))
        res = self.cache.match(toks, ns, record=False)
        if res.length:
            with pytest.raises(ValueError):
                self.cache.unlock(res.handle)

    @rule(num=st.integers(0, 40))
    def evict(self, num: int) -> None:
        before = self.cache.evictable_size
        out = self.cache.evict(num)
        assert len(out) % self.page == 0
        assert len(out) >= min(num, before)
        assert self.cache.evictable_size == before - len(out)
        self.returned.extend(int(s) for s in out)

    @rule()
    def reset(self) -> None:
        self.returned.extend(int(s) for s in self.cache.reset())
        assert self.cache.total_size == self.cache.evictable_size == 0
        if self.locked:
            with pytest.raises(ValueError):
                self.cache.lock(self.locked[0][0])
        self.locked.clear()

    @invariant()
    def integrity_and_conservation(self) -> None:
        if self.cache is None:
            return
        self.cache.check_integrity()
        held = [int(s) for s in self.cache.cached_slots()]
        everything = held + self.returned
        assert len(everything) == len(set(everything)), "a slot is accounted twice"
        assert set(everything) == self.issued, "a slot leaked"
        protected = sum(len(own) for _, _, _, own in self.locked)
        assert self.cache.protected_size <= protected


class RadixMachine(CacheMachine):
    @initialize(page=st.sampled_from([1, 2, 4, 16]), policy=st.sampled_from(available_policies()))
    def setup(self, page: int, policy: str) -> None:
        self.page = page
        self.cache = RadixCache(page_size=page, policy=policy)


class BlockHashMachine(CacheMachine):
    @initialize(page=st.sampled_from([1, 2, 4, 16]))
    def setup(self, page: int) -> None:
        self.page = page
        self.cache = BlockHashCache(page_size=page)


_settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestRadixStateful = RadixMachine.TestCase
TestRadixStateful.settings = _settings
TestBlockHashStateful = BlockHashMachine.TestCase
TestBlockHashStateful.settings = _settings

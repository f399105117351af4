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
from radixkv.cache.policies.research.density import DensityPolicy

NAMESPACES: list[Hashable | None] = [None, "lora-1", 7]


class CacheMachine(RuleBasedStateMachine):
    """Shared rules; subclasses build the cache in `setup`."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: Any = None
        self.page = 1
        self.next_slot = 0
        self.issued: set[int] = set()
        self.returned: list[int] = []  # freed via evict/reset, duplicates, partial tails
        # slot -> (namespace, token prefix ending at it), for every slot a cache adopted
        self.slot_owner: dict[int, tuple[Hashable | None, tuple[int, ...]]] = {}
        self.seqs: list[tuple[list[int], Hashable | None]] = [([], None)]
        # (handle, tokens, namespace, matched slots) for each outstanding lock
        self.locked: list[tuple[Any, list[int], Hashable | None, list[int]]] = []

    def fresh(self, n: int) -> list[int]:
        out = list(range(self.next_slot, self.next_slot + n))
        self.next_slot += n
        self.issued.update(out)
        return out

    def query(self, data: st.DataObject) -> tuple[list[int], Hashable | None]:
        """Mostly an extension of a recent sequence in its own namespace (so matches hit and
        locks overlap); sometimes a cut, or the same tokens in another namespace."""
        base, ns = data.draw(st.sampled_from(self.seqs[::-1][:8]))
        if data.draw(st.sampled_from(["keep", "keep", "keep", "cut"])) == "cut":
            base = base[: data.draw(st.integers(0, len(base)))]
        if data.draw(st.sampled_from(["keep", "keep", "keep", "move"])) == "move":
            ns = data.draw(st.sampled_from(NAMESPACES))
        return base + self.extension(data), ns

    def extension(self, data: st.DataObject) -> list[int]:
        return data.draw(
            st.lists(st.integers(0, 2), min_size=self.page, max_size=2 * self.page + 3)
        )

    def account_insert(
        self, toks: list[int], ns: Hashable | None, slots: list[int], got: int, own: int
    ) -> None:
        """The caller frees slots[own:got] (recomputed duplicates) and the partial tail; the
        cache adopts slots[got:floor], each for the token prefix that ends at it."""
        floor = len(slots) - len(slots) % self.page
        assert got % self.page == 0 and own <= got <= floor
        for i in range(got, floor):
            self.slot_owner[slots[i]] = (ns, tuple(toks[: i + 1]))
        self.returned.extend(slots[own:got])
        self.returned.extend(slots[floor:])

    def check_handle(self, handle: Any, toks: list[int], ns: Hashable | None) -> None:
        """An insert's handle covers exactly the page-floored prefix: its slots are the ones
        a match of that prefix returns, and it can be locked (and unlocked) at once."""
        floor = len(toks) - len(toks) % self.page
        if floor == 0:
            assert handle is None
            return
        want = self.cache.match(toks[:floor], ns, record=False)
        assert want.length == floor
        assert self.cache.slots_of(handle).tolist() == want.slots.tolist()
        self.cache.lock(handle)
        assert self.cache.protected_size >= floor
        self.cache.unlock(handle)

    @rule(data=st.data(), priority=st.integers(0, 2))
    def insert(self, data: st.DataObject, priority: int) -> None:
        self.do_insert(data, priority)

    @rule(data=st.data())
    def insert_more(self, data: st.DataObject) -> None:
        """A second insert rule: inserts are the only growth, so they get twice the weight."""
        self.do_insert(data, 0)

    def do_insert(self, data: st.DataObject, priority: int) -> None:
        toks, ns = self.query(data)
        slots = self.fresh(len(toks))
        res = self.cache.insert(np.array(toks, dtype=np.int64), slots, ns, priority=priority)
        self.account_insert(toks, ns, slots, res.cached, 0)
        self.check_handle(res.handle, toks, ns)
        self.seqs.append((toks, ns))

    @rule(data=st.data(), record=st.booleans(), lock=st.sampled_from([True, True, False]))
    def match(self, data: st.DataObject, record: bool, lock: bool) -> None:
        toks, ns = self.query(data)
        res = self.cache.match(toks, ns, record=record)
        assert res.length % self.page == 0 and len(res.slots) == res.length
        for i, slot in enumerate(res.slots.tolist()):  # each slot holds exactly its token's KV
            assert self.slot_owner[slot] == (ns, tuple(toks[: i + 1]))
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
        full = toks + self.extension(data)
        slots = own + self.fresh(len(full) - len(own))
        res = self.cache.insert(full, slots, ns)
        got = res.cached
        assert got >= len(own)
        self.check_handle(res.handle, full, ns)
        assert list(self.cache.match(full, ns, record=False).slots[: len(own)]) == own
        self.account_insert(full, ns, slots, got, len(own))
        self.cache.unlock(handle)
        self.seqs.append((full, ns))

    @precondition(lambda self: self.locked)
    @rule(data=st.data())
    def lock_again(self, data: st.DataObject) -> None:
        """A second request holding the same prefix: shared nodes must be counted once."""
        entry = data.draw(st.sampled_from(self.locked))
        self.cache.lock(entry[0])
        self.locked.append(entry)

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

    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        """Usually a page or two (the tree stays populated), now and then everything."""
        num = data.draw(st.sampled_from([0, 0, 1, self.page, 2 * self.page, 10**6]))
        before = self.cache.evictable_size
        out = self.cache.evict(num)
        assert len(out) % self.page == 0
        assert len(out) >= min(num, before)
        assert self.cache.evictable_size == before - len(out)
        self.returned.extend(int(s) for s in out)

    @rule(dice=st.sampled_from(["skip"] * 7 + ["reset"]))
    def reset(self, dice: str) -> None:
        if dice == "skip":  # resets are rare, so trees grow
            return
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
        locked_pages = {
            (ns, tuple(toks[:end]))
            for _, toks, ns, _ in self.locked
            for end in range(self.page, len(toks) + 1, self.page)
        }  # shared prefixes count once: no double counting of shared nodes
        assert self.cache.protected_size == self.page * len(locked_pages)
        assert self.cache.total_size == len(held)


# Every registered policy, plus `density` with constants small enough that its ghosts, refits
# and leaf sampling all happen within a 40-step run.
SMALL_DENSITY = "density (small constants)"


class RadixMachine(CacheMachine):
    @initialize(
        page=st.sampled_from([1, 2, 4, 16]),
        policy=st.sampled_from([*available_policies(), SMALL_DENSITY]),
    )
    def setup(self, page: int, policy: str) -> None:
        self.page = page
        if policy == SMALL_DENSITY:
            pol = DensityPolicy(granule=page, period=4, samples=2, decay=0.5)
            self.cache = RadixCache(page_size=page, policy=pol)
        else:
            self.cache = RadixCache(page_size=page, policy=policy)

    @rule(data=st.data(), session=st.sampled_from(["s1", "s2", "s3"]))
    def hold_session(self, data: st.DataObject, session: str) -> None:
        """A finished request of `session` references its path (never protecting it); the
        integrity check recounts every node's session references."""
        toks, ns = data.draw(st.sampled_from(self.seqs[::-1][:8]))
        res = self.cache.match(toks, ns, record=False)
        self.cache.hold_session(session, res.handle)

    @rule(session=st.sampled_from(["s1", "s2", "s3"]))
    def close_session(self, session: str) -> None:
        self.cache.release_session(session)


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

"""A new kind the prefix tree keeps is its own module(s) plus ONE registry line (issue 36, step 1).

The test-only kind "mark" is a per-boundary value with a pool of its own (the shape of an encoder
output or a summary kept at the end of a prompt): a finished request hands the tree one mark at
its last page boundary, a slot of the mark pool holding the length it was taken at; a boundary is
reusable only where a mark is (the tree's vote), and a hit reads the mark's slot. Its two halves
are its files: the tree's component (`MarkComponent`, tests/mark_kind.py) and the engine's memory
(`MarkMemory` below). It is registered with one line, `KINDS[MARK] = Kind(MarkMemory,
tree=mark_component)`, and nothing else: the engine builds the tree from that line
(`ComponentMemory.components_of` → `tree_components`) without a cache-side registry, and the
real KV manager drives it beside SWA and STATE: inserts, a match that hits only at a mark, the
mark pool running dry (the tree evicts a mark for room), FULL pressure evicting leaves (their
marks come back), and every census and the tree's integrity checked after each call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from mark_kind import MARK, MarkComponent
from radixkv.cache import ComponentSpec, HybridCache
from radixkv.cache.hybrid.components import HybridMatch
from radixkv.engine.kv.components_kv import ComponentMemory
from radixkv.engine.kv.kind_memory import KindMemoryBase, KindSetup, holding
from radixkv.engine.kv.kinds import KINDS, Kind
from radixkv.engine.kv.kv_manager import KVManager
from radixkv.engine.request import Request
from radixkv.engine.types import RequestOptions, SamplingParams
from radixkv.memory.allocator import PageAllocator
from radixkv.memory.hybrid import (
    FULL,
    STATE,
    SWA,
    KVGroupSpec,
    ModelPools,
    PoolSpec,
    StateGroupSpec,
)
from radixkv.memory.req_table import ReqToTokenTable
from radixkv.memory.state_pool import StateLayerSpec, StateTensorSpec

PS = 4


# -- the test-only kind, engine side: what a new kind's module holds --------------------------
def mark_component(spec: PoolSpec) -> ComponentSpec:
    """What the tree keeps of the kind for a model (its registry line's `tree`)."""
    return ComponentSpec(MarkComponent)


@dataclass
class MarkHold:
    resume: int = -1  # the mark the match resumes at (the tree's; -1: none)


class MarkMemory(KindMemoryBase):
    """One mark per finished request, at its last page boundary; a hit reads its mark. The
    calls it does not need are `KindMemoryBase`'s neutral answers."""

    kind = MARK

    def __init__(self, pool: torch.Tensor, setup: KindSetup) -> None:
        self.pool = pool
        self.alloc_ = PageAllocator(pool.shape[0], 1)
        self.cache = setup.cache
        self.evict = setup.evict
        self.seen: list[float] = []  # what each hit read from its mark at bind (for the test)

    def on_match(self, req: Request, m: HybridMatch) -> None:
        holding(req, MARK, MarkHold).resume = m.kinds[MARK]

    def bind(self, req: Request, prefix_len: int) -> None:
        if prefix_len > 0:
            self.seen.append(float(self.pool[holding(req, MARK, MarkHold).resume]))

    def tree_part(self, req: Request, aligned: int, finishing: bool) -> Any:
        if not finishing:
            return None
        got = self.alloc_.alloc_pages(1)
        if got is None and self.cache is not None:
            self.evict(MARK, 1)  # the tree lets a mark go (and the coordinator frees it)
            got = self.alloc_.alloc_pages(1)
        if got is None:
            return None
        self.pool[got[0]] = float(aligned)
        return [(aligned, got[0])]

    def take_freed(self, value: Any) -> None:
        if value:
            self.alloc_.free_page_ids(list(value))

    def census(self, running: Sequence[Request]) -> dict[str, int]:
        cached = self.cache.held(MARK) if self.cache is not None else 0
        size, free = self.alloc_.num_pages, self.alloc_.free_pages
        return {"size": size, "free": free, "cached": cached, "held": 0}  # all marks the tree's

    def check(self, running: Sequence[Request]) -> None:
        self.alloc_.check()
        if self.cache is not None:
            assert all(self.alloc_.is_allocated(u) for u in self.cache.held_values(MARK))


# -- driving it through the KV manager --------------------------------------------------------
def _memory(monkeypatch: pytest.MonkeyPatch, marks: int) -> tuple[KVManager, ComponentMemory]:
    monkeypatch.setitem(KINDS, MARK, Kind(MarkMemory, tree=mark_component))  # the one line
    state = StateLayerSpec((StateTensorSpec("h", (2,)),))
    spec = PoolSpec(
        {
            FULL: KVGroupSpec(1, 1, 2),
            SWA: KVGroupSpec(1, 1, 2, window=8),
            STATE: StateGroupSpec((state,)),
        }
    )
    made = spec.make_pools({FULL: 64, SWA: 64, STATE: 16})
    pools = ModelPools({**{k: made[k] for k in made.kinds}, MARK: torch.zeros(marks)})
    allocator = PageAllocator(64, PS)
    components = ComponentMemory.components_of(spec)  # the engine's path: from the registry
    assert components.names() == ("full", "swa:8", "state", MARK)
    tree = HybridCache(components, PS)
    comp = ComponentMemory(spec, pools, allocator, PS, 4, 64, "cpu", tree, 8)
    return KVManager(allocator, ReqToTokenTable(4, 64), None, comp), comp


def _request(rid: str, prompt: list[int]) -> Request:
    stream: Any = None
    return Request(rid, prompt, SamplingParams(), RequestOptions(), stream, None)


def _run(kv: KVManager, prompt: list[int]) -> Request | None:
    """Admit a request for `prompt`, prefill it, decode until its K/V ends on a page boundary,
    release it (its tokens go to the tree, with a mark at the end), every census checked after
    each call; None when it could not be admitted."""
    req = _request(f"r{len(prompt)}", prompt)
    if kv.admit(req, 0) is None:
        return None
    kv.check([req])
    while req.pending > 1:
        n = min(req.pending - 1, kv.chunk_cap(req))
        assert kv.prepare_chunk(req, n)
        req.kv_len += n
        kv.after_step(req, was_prefill=True)
        kv.commit_prefix(req)
        kv.check([req])
    while req.kv_len < len(prompt) or req.kv_len % PS:  # decode steps
        assert kv.grow(req, req.kv_len + 1)
        req.kv_len += 1
        kv.after_step(req, was_prefill=False)
        req.tokens.append(7)  # the sampled token
        kv.check([req])
    kv.release(req)
    kv.check([])
    return req


def test_a_test_only_tree_kind_rides_the_engine_through_one_registry_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kv, comp = _memory(monkeypatch, marks=2)
    tree, marks = comp.cache, comp.kinds[MARK]
    assert isinstance(tree, HybridCache) and isinstance(tree.component(MARK), MarkComponent)
    assert list(comp.kinds) == [SWA, STATE, MARK] and isinstance(marks, MarkMemory)
    a = _run(kv, list(range(10, 23)))  # 13 prompt tokens, K/V of 16 tokens when it ends
    assert a is not None and (a.prefix_len, len(a.tokens)) == (0, 17)
    assert comp.census([])[MARK] == {"size": 2, "free": 1, "cached": 1, "held": 0}
    # The next turn of the conversation hits at a's mark (16) and reads its value there.
    turn = _run(kv, [*a.tokens, 200, 201, 202])
    assert turn is not None and marks.seen == [16.0]
    assert comp.census([])[MARK] == {"size": 2, "free": 0, "cached": 2, "held": 0}
    # A prompt sharing 8 tokens: SWA and STATE accept 8, the mark vetoes it (none there). The
    # mark pool is dry when it ends: the tree lets the oldest mark (a's) go for its mark.
    shared = _run(kv, [*a.tokens[:8], 90, 91, 92, 93, 94])
    assert shared is not None and marks.seen == [16.0] and tree.held(MARK) == 2
    assert tree.match(list(a.tokens)[:16], record=False).length == 0  # a's mark went
    assert tree.match(list(turn.tokens)[:20], record=False).length == 20  # its mark stays
    # FULL pressure: a long prompt evicts leaves, and their marks come back to the pool.
    long = _run(kv, list(range(300, 353)))  # 52 tokens of the 64 FULL slots
    assert long is not None and tree.match(list(turn.tokens)[:20], record=False).length == 0
    assert comp.census([])[MARK]["cached"] == 1  # only the long one's mark is left
    # Everything the tree held of the kind comes back on a flush.
    comp.flush(idle=True)
    kv.check([])
    assert comp.census([])[MARK] == {"size": 2, "free": 2, "cached": 0, "held": 0}

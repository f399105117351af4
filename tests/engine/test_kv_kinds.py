"""A new kind of KV memory is its own module plus one registry line (issue 36, step 1).

`Scratch` below is a test-only kind, the shape of an encoder cache: each running request holds one
slot of its own pool for its whole life, a fork gets a copy, the tree never sees it. Everything
it is lives in this file, as a new kind's module would hold it: what its layers keep
(`ScratchGroupSpec`, a layer group a model config puts in its `PoolSpec`), how its pool is sized
(`ScratchSizing`: one slot per running request) and its memory (`ScratchMemory`). It is
registered with one line (`KINDS[SCRATCH] = Kind(ScratchMemory, ScratchSizing())`: no tier store,
no tree component); then the engine's own memory factory (`build_memory`) sizes its pool
(`pool_sizes`), makes it (`PoolSpec.make_pools`) and wires it into the real KV manager and the
hybrid coordinator next to a STATE kind, which drive it through admission, prefill, decode, a
fork, the tree's insert and release, with every census checked after each call. Nothing in src
is changed for it. The tiers need nothing of it either: a kind the tree never sees has no tier
store, and a prefix evicted from the device comes back from the host tier (FULL pages and a STATE
checkpoint) for a request that holds a scratch slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from radixkv.config import EngineConfig
from radixkv.engine.kv.components_kv import ComponentMemory
from radixkv.engine.kv.kind_memory import KindMemoryBase, KindSetup
from radixkv.engine.kv.kind_sizing import SizeContext
from radixkv.engine.kv.kinds import KINDS, Kind, pool_sizes
from radixkv.engine.kv.kv_manager import KVManager
from radixkv.engine.kv.memory_factory import build_memory
from radixkv.engine.request import Request
from radixkv.engine.tiers.manager import TierManager
from radixkv.engine.types import RequestOptions, SamplingParams
from radixkv.memory.allocator import PageAllocator
from radixkv.memory.hybrid import (
    FULL,
    STATE,
    KVGroupSpec,
    ModelPools,
    PoolSpec,
    StateGroupSpec,
)
from radixkv.memory.pool import KVPool, KVPoolConfig
from radixkv.memory.state_pool import StateLayerSpec, StateTensorSpec

SCRATCH = "scratch"
PS = 4


# -- the test-only kind: what a new kind's module holds ---------------------------------------
@dataclass(frozen=True)
class ScratchGroupSpec:
    """What the scratch layers keep (a `LayerGroupSpec`): one value per layer per slot."""

    num_layers: int = 1

    def slot_bytes(self, dtype: torch.dtype) -> int:
        return self.num_layers * torch.empty((), dtype=dtype).element_size()

    def make_pool(self, num_slots: int, dtype: torch.dtype, device: str) -> torch.Tensor:
        return torch.zeros(num_slots, self.num_layers, dtype=dtype, device=device)


class ScratchSizing:
    """Its pool (a `KindSizing`): one slot per running request, outside the KV byte budget."""

    budgeted = False

    def slot_bytes(self, ctx: SizeContext) -> int:
        return ctx.spec.slot_bytes(SCRATCH, ctx.dtype)

    def explicit(self, cfg: EngineConfig) -> int | None:
        return None

    def demand(self, ctx: SizeContext) -> int | None:
        return ctx.max_running

    def settle(self, n: int, ctx: SizeContext, explicit: bool) -> int:
        if n < 1:
            raise ValueError("the scratch pool needs a slot")
        return n


@dataclass
class ScratchHold:
    slot: int = -1


class ScratchMemory(KindMemoryBase):
    """One scratch slot per running request (a tensor row it fills at bind), copied on fork."""

    kind = SCRATCH

    def __init__(self, pool: torch.Tensor, setup: KindSetup) -> None:
        self.pool = pool
        self.alloc_ = PageAllocator(pool.shape[0], 1)
        self.bound: list[str] = []  # what the coordinator called, for the test to read

    def _slot(self, req: Request) -> int:
        h = req.kv_kinds.get(SCRATCH)
        return -1 if h is None else int(h.slot)

    def reserve(self, req: Request) -> bool:
        got = self.alloc_.alloc_pages(1)
        if got is None:
            return False
        req.kv_kinds[SCRATCH] = ScratchHold(got[0])
        return True

    def unreserve(self, req: Request) -> None:
        h = req.kv_kinds.pop(SCRATCH, None)
        if h is not None:
            self.alloc_.free_page_ids([h.slot])

    def bind(self, req: Request, prefix_len: int) -> None:
        self.pool[self._slot(req)] = float(len(req.prompt_ids))
        self.bound.append(req.request_id)

    def chunk_cap(self, req: Request) -> int | None:
        return 3  # this kind prefills 3 tokens a step at most

    def after_step(self, req: Request, was_prefill: bool) -> None:
        self.pool[self._slot(req)] += 1

    def reserve_fork(self, parent: Request) -> int | None:
        got = self.alloc_.alloc_pages(1)
        return None if got is None else got[0]

    def unreserve_fork(self, held: int) -> None:
        self.alloc_.free_page_ids([held])

    def bind_fork(self, parent: Request, child: Request, held: int) -> None:
        child.kv_kinds[SCRATCH] = ScratchHold(held)
        self.pool[held] = self.pool[self._slot(parent)]

    def release(self, req: Request) -> None:
        h = req.kv_kinds.pop(SCRATCH, None)
        if h is not None:
            self.alloc_.free_page_ids([h.slot])

    def census(self, running: Sequence[Request]) -> dict[str, int]:
        held = sum(self._slot(r) >= 0 for r in running)
        size, free = self.alloc_.num_pages, self.alloc_.free_pages
        return {"size": size, "free": free, "cached": 0, "held": held}

    def check(self, running: Sequence[Request]) -> None:
        self.alloc_.check()


# -- driving it through the KV manager --------------------------------------------------------
def _request(rid: str, prompt: list[int]) -> Request:
    stream: Any = None
    return Request(rid, prompt, SamplingParams(), RequestOptions(), stream, None)


@dataclass(frozen=True)
class ScratchModelConfig:
    """A model config that declares a scratch layer beside a FULL and a STATE layer: all a
    model family adds to name a new kind of layer is its group in `pool_spec`."""

    def pool_spec(self) -> PoolSpec:
        state = StateLayerSpec((StateTensorSpec("h", (2,)),))
        return PoolSpec(
            {
                FULL: KVGroupSpec(1, 1, 2),
                STATE: StateGroupSpec((state,)),
                SCRATCH: ScratchGroupSpec(),
            }
        )


def _config(host_tier: bool = False) -> EngineConfig:
    return EngineConfig(
        num_slots=64,
        page_size=PS,
        max_running_requests=2,  # so the scratch kind's default pool is 2 slots
        state_num_slots=8,
        state_checkpoint_interval=8,
        chunked_prefill_size=64,
        enable_hierarchical_cache=host_tier,  # L2 as the engine builds it
    )


def _memory(monkeypatch: pytest.MonkeyPatch, host_tier: bool = False) -> tuple[KVManager, Any]:
    """The engine's memory for a model with a scratch layer: its factory, unchanged."""
    monkeypatch.setitem(KINDS, SCRATCH, Kind(ScratchMemory, ScratchSizing()))  # the one line
    lm = SimpleNamespace(config=ScratchModelConfig(), model=SimpleNamespace())
    memory = build_memory(_config(host_tier), lm, torch.float32, "cpu", max_model_len=64)
    assert memory.pools is not None
    return memory.kv, memory.pools[SCRATCH]


def test_a_test_only_kind_is_sized_and_made_from_its_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The registry's sizing sizes the scratch pool, the kind's group spec makes it; without
    its registry line the kind has no sizing and is refused."""
    spec = ScratchModelConfig().pool_spec()
    with pytest.raises(ValueError, match=r"no sizing registered for KV kind 'scratch'"):
        pool_sizes(_config(), spec, torch.float32)
    monkeypatch.setitem(KINDS, SCRATCH, Kind(ScratchMemory, ScratchSizing()))
    sizes = pool_sizes(_config(), spec, torch.float32)
    assert sizes == {FULL: 64, STATE: 8, SCRATCH: 2}
    assert spec.slot_bytes(SCRATCH, torch.bfloat16) == 2
    pools = spec.make_pools(sizes, torch.bfloat16)
    assert pools.kinds == (FULL, STATE, SCRATCH)
    assert pools[SCRATCH].shape == (2, 1) and pools[SCRATCH].dtype == torch.bfloat16


def _admit(kv: KVManager, req: Request) -> bool:
    return kv.admit(req, 0) is not None


def _prefill(kv: KVManager, req: Request, running: list[Request]) -> int:
    steps = 0
    while req.pending > 1:
        n = min(req.pending - 1, kv.chunk_cap(req))
        assert n <= 3, "the scratch kind's chunk cap binds"
        assert kv.prepare_chunk(req, n)
        req.kv_len += n
        kv.after_step(req, was_prefill=True)
        kv.commit_prefix(req)
        kv.check(running)
        steps += 1
    return steps


def test_a_test_only_kind_rides_the_one_memory_path(monkeypatch: pytest.MonkeyPatch) -> None:
    kv, scratch = _memory(monkeypatch)
    comp = kv.comp
    assert isinstance(comp, ComponentMemory) and list(comp.kinds) == [STATE, SCRATCH]
    a = _request("a", list(range(10, 23)))
    assert _admit(kv, a)
    running = [a]
    kv.check(running)
    assert _prefill(kv, a, running) >= 4  # 12 tokens, 3 at most a step
    assert a.kv_kinds[SCRATCH].slot >= 0 and float(scratch[a.kv_kinds[SCRATCH].slot]) > 13
    census = comp.census(running)
    assert census[SCRATCH] == {"size": 2, "free": 1, "cached": 0, "held": 1}
    assert census[STATE]["held"] == 1
    # A fork: the scratch kind gets its own slot, a copy of the parent's.
    b = _request("a", a.prompt_ids)
    b.index = 1
    assert kv.fork(a, b) is not None
    running.append(b)
    kv.check(running)
    pa, pb = a.kv_kinds[SCRATCH].slot, b.kv_kinds[SCRATCH].slot
    assert pa != pb and float(scratch[pb]) == float(scratch[pa])
    # The scratch pool is full now: a third request waits, nothing is kept from the try.
    c = _request("c", list(range(50, 60)))
    free_state = comp.census(running)[STATE]["free"]
    assert not _admit(kv, c)
    assert comp.census(running)[STATE]["free"] == free_state  # its state slot was given back
    kv.check(running)
    for r in (a, b):
        kv.release(r)
        running.remove(r)
        kv.check(running)
    assert comp.census(running)[SCRATCH]["free"] == 2
    assert _admit(kv, c)  # room again
    kv.release(c)
    kv.check([])


def test_an_unregistered_kind_is_refused() -> None:
    spec = PoolSpec({FULL: KVGroupSpec(1, 1, 2)})
    full = KVPool(KVPoolConfig(1, 1, 2, 16))
    pools = ModelPools({FULL: full, "mla": torch.zeros(4)})
    with pytest.raises(ValueError, match=r"no memory registered.*mla"):
        ComponentMemory(spec, pools, PageAllocator(16, PS), PS, 2, 16, "cpu", None, 8)


def test_a_prefix_comes_back_from_the_host_tier_next_to_a_test_only_kind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """L2 on, the scratch kind registered and no tier change for it: a finished request's FULL
    pages and STATE checkpoints reach L2; evicted from the device (and the device's state values
    lost), they load back for the same prompt, whose working state is the checkpoint's and which
    gets its scratch slot as any request; every census (device, kinds, host) balances."""
    kv, _ = _memory(monkeypatch, host_tier=True)
    comp, tiers = kv.comp, kv.tiers
    assert isinstance(comp, ComponentMemory) and isinstance(tiers, TierManager)
    assert list(tiers.stores) == [STATE]  # a store for each kind the registry names one for
    state = comp.pools[STATE].tensors[0]["h"]
    prompt = list(range(10, 23))  # 12 tokens prefilled: checkpoints at 4, 8 and 12
    a = _request("a", prompt)
    assert _admit(kv, a)
    state[a.kv_kinds[STATE].slot] = 7.0  # what the model's state would be
    _prefill(kv, a, [a])
    kv.release(a)
    kv.check([])
    assert tiers.stats()["host_state_saved"] == 3 and tiers.counters.host_saved_pages == 3
    comp.flush(idle=False)  # the device's tree lets everything go (L2 keeps it) ...
    state.zero_()  # ... and its state values are gone
    kv.check([])
    assert comp.census([])[STATE]["cached"] == 0 and kv.census([])[1] == 0
    b = _request("b", prompt)
    assert _admit(kv, b)
    kv.check([b])
    assert b.prefix_len == 12 and tiers.loaded_split(b) == (12, 0)
    assert float(state[b.kv_kinds[STATE].slot][0]) == 7.0  # resumed from the loaded checkpoint
    assert b.kv_kinds[SCRATCH].slot >= 0
    assert tiers.index.held_pages == 0 and tiers.stores[STATE].index.held_pages == 0
    kv.release(b)
    kv.check([])

"""The tiers are called and never call back: a TierManager works with no KV manager and no tree
at all (it is handed slots and returns load plans), a load plan keeps its L2 pages through the
write-back demotion its own device allocation may cause, the tiers modules import neither the
tree nor the KV manager, and a request the KV manager holds for its storage pages can be
aborted there."""

from __future__ import annotations

import ast
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from engine_helpers import GREEDY
from tier_helpers import SlowBackend, prompts, reference, run_one_by_one, tier_engine

import radixkv.engine.tiers.manager as tiers_mod
import radixkv.engine.tiers.storage_tier as storage_tier_mod
from radixkv.engine.tiers.manager import TierManager
from radixkv.engine.tiers.tier_setup import NoTiers
from radixkv.memory.pool import KVPool, KVPoolConfig

PS = 4


def _pool(num_pages: int = 8) -> KVPool:
    pool = KVPool(KVPoolConfig(2, 1, 2, num_pages * PS))
    for layer in range(2):  # every device page holds values of its own
        vals = torch.arange(num_pages * PS, dtype=torch.float32) * 10 + layer
        pool.k[layer].copy_(vals[:, None, None].expand_as(pool.k[layer]))
        pool.v[layer].copy_(-vals[:, None, None].expand_as(pool.v[layer]))
    return pool


def _req(rid: str, tokens: list[int]) -> Any:
    return SimpleNamespace(
        request_id=rid, index=0, tokens=tokens, namespace=None, options=SimpleNamespace()
    )


def _slots(pages: list[int]) -> np.ndarray:
    return np.concatenate([np.arange(p * PS, (p + 1) * PS) for p in pages]).astype(np.int64)


def _page(pool: KVPool, p: int) -> torch.Tensor:
    return torch.stack([pool.k[0][p * PS : (p + 1) * PS], pool.v[1][p * PS : (p + 1) * PS]])


def test_load_plan_keeps_its_pages_through_write_back_demotion() -> None:
    pool = _pool()
    t = TierManager(pool, PS, host_pages=2, write_policy="write_back", fingerprint="fp")
    a = _req("a", list(range(2 * PS + 1)))
    t.on_insert(a, _slots([0, 1]), 0, 2 * PS)  # the tree adopted device pages 0, 1
    want = [_page(pool, 0).clone(), _page(pool, 1).clone()]
    t.on_evict(_slots([0, 1]))  # ... and evicts them: write_back demotes both into L2 (full)
    plan = t.plan_load(a, 0)
    assert plan is not None and len(plan.host_pages) == 2
    # The device allocation for the plan evicts other L1 pages; write_back would demote them
    # into the (full) L2 and drop its least recently used pages, the planned ones, without
    # the plan's reservation.
    b = _req("b", [100 + i for i in range(2 * PS + 1)])
    t.on_insert(b, _slots([2, 3]), 0, 2 * PS)
    t.on_evict(_slots([2, 3]))
    assert t.counters.host_saved_pages == 2  # b's pages found no room
    t.load(plan, [4, 5])
    for got, page in zip(want, (4, 5), strict=True):
        assert torch.equal(_page(pool, page), got)
    assert t.index.held_pages == 0  # the reservation ended with the load
    t.on_insert(a, _slots([4, 5]), 0, 2 * PS)  # the KV manager inserted them: L2 hits
    assert t.loaded_split(a) == (2 * PS, 0)
    t.check()
    assert t.device_pages() == {4, 5}


def test_a_plan_without_device_pages_copies_nothing_and_frees_its_reservation() -> None:
    pool = _pool()
    t = TierManager(pool, PS, host_pages=4, write_policy="write_through", fingerprint="fp")
    a = _req("a", list(range(3 * PS + 1)))
    t.on_insert(a, _slots([0, 1, 2]), 0, 3 * PS)
    t.on_evict(_slots([0, 1, 2]))
    assert t.plan_load(a, 3 * PS) is None  # all of it matched in L1: nothing to load
    plan = t.plan_load(a, PS)
    assert plan is not None and len(plan.host_pages) == 2
    before = [x.clone() for x in pool.k]
    t.load(plan, None)  # the KV manager found no device pages
    assert all(torch.equal(x, y) for x, y in zip(before, pool.k, strict=True))
    assert t.index.held_pages == 0 and t.loaded_split(a) == (0, 0)


def test_no_tiers_is_a_null_object_with_the_same_methods() -> None:
    public = {n for n in dir(TierManager) if not n.startswith("_")}
    used_by_kv = {"on_insert", "on_evict", "on_l1_hit", "plan_load", "load", "end_match"}
    used_by_kv |= {"start_prefetch", "prefetch_pending", "end_hold", "poll", "has_storage"}
    used_by_kv |= {"observe_prefill", "forget", "loaded_split", "flush", "close", "stats"}
    used_by_kv |= {"check", "device_pages", "on_kinds_insert"}
    assert used_by_kv <= public
    null = NoTiers()
    assert used_by_kv <= {n for n in dir(null) if not n.startswith("_")}
    assert null.plan_load(_req("a", [1, 2, 3]), 0) is None
    assert null.start_prefetch(_req("a", [1, 2, 3]), 0) is None
    assert null.stats() == {} and null.loaded_split(_req("a", [1])) == (0, 0)
    assert not null.has_storage and null.close(set())


@pytest.mark.parametrize("module", [tiers_mod, storage_tier_mod])
def test_tiers_import_neither_the_tree_nor_the_kv_manager(module: ModuleType) -> None:
    imported: set[str] = set()
    for node in ast.walk(ast.parse(Path(str(module.__file__)).read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
    banned = ("radixkv.engine.kv.kv_manager", "radixkv.cache.radix", "radixkv.cache.hybrid.cache")
    assert not [m for m in imported if m.startswith(banned)], imported
    assert not [m for m in imported if m == "radixkv.cache" or m == "radixkv.cache.base"]


def test_request_aborted_while_held_for_storage_leaves_nothing_behind(tmp_path: Path) -> None:
    """The KV manager holds a request for its L3 pages; aborting it there ends the hold (it is
    no longer counted as waiting), pins nothing in L2, and the same prompt later still gets
    the right output from the pages its fetch landed."""
    flags = {
        "hicache_storage_backend": "file",
        "hicache_storage_url": str(tmp_path / "l3"),
        "hicache_storage_prefetch_policy": "wait_complete",
    }
    x = prompts(seed=3, n=1)[0]
    want = reference(seed=3, n=1)
    a = tier_engine(**flags)
    assert run_one_by_one(a, seed=3, n=1) == want and a.close()
    e = tier_engine(**flags)
    assert e.tiers is not None and e.tiers.worker is not None
    e.tiers.worker.backend = SlowBackend(e.tiers.worker.backend, delay_s=0.3, hits_only=True)
    rid = e.add_request(x, GREEDY)
    assert len(e.kv.held) == 1 and e.metrics().waiting_requests == 1
    assert e.step() == [] and len(e.kv.held) == 1  # still fetching
    assert e.abort(rid)
    deltas = e.step()
    assert [(d.request_id, d.finish_reason) for d in deltas] == [(rid, "abort")]
    assert not e.has_unfinished() and len(e.kv.held) == 0
    assert e.metrics().waiting_requests == 0
    e.check_memory()
    assert run_one_by_one(e, seed=3, n=1) == want
    assert e.metrics().cached_tokens_by_tier["storage"] > 0
    e.tiers.worker.drain_writes(10.0)
    e.tiers.poll()
    assert e.metrics().tier_stats["host_held_pages"] == 0
    e.check_memory()
    assert e.close()


def test_a_write_through_copy_l2_had_no_room_for_is_made_when_l1_evicts_the_page() -> None:
    """Every L2 page pinned (pending L3 writes, fetched pages of held requests): the pages the
    tree adopts then cannot be copied at once. They must not be lost: L1's eviction copies them
    down, as write_back would, and they load back with their values."""
    pool = _pool()
    t = TierManager(pool, PS, host_pages=2, write_policy="write_through", fingerprint="fp")
    a = _req("a", list(range(2 * PS + 1)))
    t.on_insert(a, _slots([0, 1]), 0, 2 * PS)  # a's pages fill L2 ...
    pinned = [t.index.lookup(h) for h in t.hashes(a, 2 * PS)]
    for hp in pinned:
        t.index.pin(hp)  # ... and stay pinned (say, their L3 writes are pending)
    b = _req("b", [100 + i for i in range(2 * PS + 1)])
    t.on_insert(b, _slots([2, 3]), 0, 2 * PS)
    assert t.counters.host_save_dropped_pages == 2 and t.plan_load(b, 0) is None
    t.check()
    want = [_page(pool, 2).clone(), _page(pool, 3).clone()]
    for hp in pinned:
        t.index.unpin(hp)  # the writes were confirmed
    t.on_evict(_slots([2, 3]))  # L1 frees b's pages: their copies are made now
    assert t.counters.host_saved_pages == 4
    plan = t.plan_load(b, 0)
    assert plan is not None and len(plan.host_pages) == 2
    t.load(plan, [6, 7])
    for got, page in zip(want, (6, 7), strict=True):
        assert torch.equal(_page(pool, page), got)
    t.on_evict(_slots([0, 1]))  # a's pages had their copies: nothing more is saved
    assert t.counters.host_saved_pages == 4
    t.check()


def test_pages_l2_had_no_room_for_reach_storage_at_shutdown(tmp_path: Path) -> None:
    """A clean shutdown stages what only L1 holds into L3 under write_through too: the pages
    whose L2 copy found no room."""
    pool = _pool()
    t = TierManager(pool, PS, 2, "write_through", "fp", storage=("file", str(tmp_path / "l3")))
    a = _req("a", list(range(2 * PS + 1)))
    t.on_insert(a, _slots([0, 1]), 0, 2 * PS)
    for h in t.hashes(a, 2 * PS):
        t.index.pin(t.index.lookup(h))
    b = _req("b", [100 + i for i in range(2 * PS + 1)])
    t.on_insert(b, _slots([2, 3]), 0, 2 * PS)
    assert t.counters.host_save_dropped_pages == 2
    for h in t.hashes(a, 2 * PS):
        t.index.unpin(t.index.lookup(h))
    assert t.storage is not None and t.storage.worker.drain_writes(5.0)
    t.poll()  # a's L3 writes confirmed: their L2 pages are evictable again
    assert t.close({0, 1, 2, 3})
    stored = {p.name for p in (tmp_path / "l3").rglob("*") if p.is_file()}
    assert {h.hex() for h in t.hashes(a, 2 * PS) + t.hashes(b, 2 * PS)} <= stored


def test_a_page_the_store_lost_is_no_longer_counted_as_known(tmp_path: Path) -> None:
    """The replica's record of what it confirmed in L3 (the prefetch policy's floor of the
    share found) forgets a page a fetch misses: the store lost it (a wiped Redis, a deleted
    file), and later decisions must not count on it."""
    pool = _pool()
    t = TierManager(pool, PS, 4, "write_through", "fp", storage=("file", str(tmp_path / "l3")))
    assert t.storage is not None
    a = _req("a", list(range(2 * PS + 1)))
    t.on_insert(a, _slots([0, 1]), 0, 2 * PS)
    assert t.storage.worker.drain_writes(5.0)
    t.poll()
    first, second = t.hashes(a, 2 * PS)
    assert {first, second} <= t.storage.known_hashes
    next((tmp_path / "l3").rglob(second.hex())).unlink()  # the store lost the second page
    t.flush(device_reset=True)  # nothing in L1 or L2: the prompt's pages are asked of L3
    t.start_prefetch(_req("a2", list(range(2 * PS + 1))), 0)
    deadline = time.monotonic() + 5
    while t.storage.prefetch_pending("a2") and time.monotonic() < deadline:
        t.poll(0.05)
    assert first in t.storage.known_hashes and second not in t.storage.known_hashes

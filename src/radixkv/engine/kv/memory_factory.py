"""The engine's memory, built in one place from the configuration and the loaded model: the KV
pool(s), the page allocator, the request → token table(s), the prefix cache, the host/storage
tiers and the KV manager that moves slots between them.

A FULL-only model gets one KV pool and a plain prefix cache (`setup.make_prefix_cache`). A hybrid
model (SWA / STATE components, `setup.hybrid_spec`) gets one pool per kind it has, each sized by
its kind's sizing (`kinds.pool_sizes`), the hybrid tree and `ComponentMemory`; a model without
FULL layers still gets a FULL pool, of zero layers (token bookkeeping slots, no tensor).
Everything is wired through constructor arguments: nothing built here is patched afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from radixkv.config import EngineConfig
from radixkv.engine import setup
from radixkv.engine.events import kv_events
from radixkv.engine.kv import kinds
from radixkv.engine.kv.components_kv import ComponentMemory
from radixkv.engine.kv.kinds import pool_sizes
from radixkv.engine.kv.kv_manager import KVManager
from radixkv.engine.tiers import tier_setup
from radixkv.memory.allocator import PageAllocator
from radixkv.memory.hybrid import FULL, ModelPools, PoolSpec
from radixkv.memory.pool import KVPool, KVPoolConfig
from radixkv.memory.req_table import ReqToTokenTable


@dataclass(frozen=True)
class EngineMemory:
    """What `build_memory` made. `pool` is the FULL pool (zero layers when the model has none);
    `pools` every kind's pool of a hybrid model, keyed by kind (None for a FULL-only model)."""

    pool: KVPool
    pools: ModelPools | None
    allocator: PageAllocator
    table: ReqToTokenTable
    kv: KVManager
    scratch_slot: int | None = None  # the decode graphs' scratch slot, outside the allocator


def build_memory(
    cfg: EngineConfig,
    lm: Any,
    dtype: torch.dtype,
    device: str,
    max_model_len: int,
    scratch: bool = False,
) -> EngineMemory:
    """The engine's memory for `lm` (a loaded model: .model / .config / .tokenizer) under the
    validated `cfg`; raises ValueError for a combination the engine does not serve. `scratch`:
    take the pool's last page out of the allocator's range for the decode graphs' padding
    (radixkv.engine.graph_runner)."""
    mc = lm.config
    spec: PoolSpec | None = setup.hybrid_spec(mc, cfg)
    page_size = cfg.cache.page_size
    pools: ModelPools | None = None
    if spec is None:
        num_slots = setup.num_slots(cfg.cache, mc, dtype)
        pool = KVPool(mc.pool_config(num_slots, dtype, device))
    else:
        sizes = pool_sizes(cfg, spec, dtype)
        num_slots = sizes[FULL]
        pools = spec.make_pools(sizes, dtype, device)
        # No FULL layer: a zero-layer bookkeeping pool (no tensor, so no shape to speak of).
        pool = pools.kv(FULL) or KVPool(KVPoolConfig(0, 1, 1, num_slots, dtype, device))
    allocator = PageAllocator(num_slots, page_size)
    scratch_slot = allocator.reserve_tail() if scratch else None
    # A request's row holds its whole context: at most max_model_len, never more than the pool.
    max_context = min(allocator.pages_for(max_model_len) * page_size, allocator.num_slots)
    max_running = cfg.scheduler.max_running_requests
    table = ReqToTokenTable(max_running, max_context, device)
    comp = None
    if spec is not None and pools is not None:
        components = ComponentMemory.components_of(spec)
        comp = ComponentMemory(
            spec,
            pools,
            allocator,
            page_size,
            max_running,
            max_context,
            device,
            setup.make_hybrid_cache(cfg.cache, components),
            cfg.cache.state_checkpoint_interval,
        )
    plain = setup.make_prefix_cache(cfg.cache) if spec is None else None
    tiers = tier_setup.make_tiers(
        cfg.cache,
        pool,
        lm,
        cfg.scheduler.chunked_prefill_size,
        pools,
        spec,
        kinds.tier_stores(),  # the tiers keep every kind whose registry line has a store
    )
    tree = plain if comp is None else comp.cache
    events = kv_events.sink_for_engine(cfg.cache, tree, tiers, spec)
    kv = KVManager(allocator, table, plain, comp, tiers, events)
    return EngineMemory(pool, pools, allocator, table, kv, scratch_slot)

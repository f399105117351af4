"""Building the hierarchical cache from the cache section (checked by radixkv.config): L2 size,
the model fingerprint, one store per kind of KV besides FULL (kind -> its `KindStore` class,
engine/tiers/kind_store.py, as the caller passes them: the KV registry's lines,
engine/kv/kinds.py, which the tiers never import); `NoTiers` stands in when the config asks for
none."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from radixkv.config import CacheConfig
from radixkv.engine.request import Request
from radixkv.engine.tiers.kind_store import KindStore, StoreSetup
from radixkv.engine.tiers.manager import LoadPlan, TierManager
from radixkv.engine.tiers.prefetch import PrefetchPolicy
from radixkv.engine.tiers.tier_residency import TierOp
from radixkv.memory.host_pool import HostKVPool
from radixkv.memory.hybrid import FULL, ModelPools, PoolSpec
from radixkv.memory.pool import KVPool

# kind -> its store's class, built from the kind's device pool and a StoreSetup.
StoreClasses = Mapping[str, Callable[[Any, StoreSetup], KindStore]]

_SAMPLE = 4096  # values per tensor that enter the weights digest


def model_fingerprint(lm: Any, dtype: torch.dtype) -> str:
    """Architecture + config + a weights digest + KV dtype, as hex. The digest covers every
    parameter's name, shape and dtype and a strided sample of its values (hashing all weights of a
    large model would take seconds at start-up); two checkpoints differing only outside the
    sample would collide, which fine-tunes of one base in practice never do."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(lm.config).encode())
    h.update(str(dtype).encode())
    with torch.no_grad():
        for name, p in _named_tensors(lm.model):
            h.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
            flat = p.detach().reshape(-1)
            step = max(1, flat.numel() // _SAMPLE)
            sample = flat[::step][:_SAMPLE].to("cpu", torch.float32).contiguous()
            h.update(sample.numpy().tobytes())
    return h.hexdigest()


def _named_tensors(model: Any) -> list[tuple[str, torch.Tensor]]:
    """A torch module's state dict, or (for plain objects) their tensor attributes."""
    if hasattr(model, "state_dict"):
        items = model.state_dict().items()
    else:
        items = ((k, v) for k, v in vars(model).items() if isinstance(v, torch.Tensor))
    return sorted(items, key=lambda kv: kv[0])


def make_tiers(
    cfg: CacheConfig,
    pool: KVPool,
    lm: Any,
    chunk_tokens: int = 2048,
    pools: ModelPools | None = None,
    spec: PoolSpec | None = None,
    store_classes: StoreClasses | None = None,
) -> TierManager | NoTiers:
    """The TierManager the config asks for, or NoTiers. Without enable_hierarchical_cache but with
    a storage backend, L2 is a staging area a quarter of the device pool (L3 without L2).
    `chunk_tokens`: the scheduler's prefill budget per step (the cost model's recompute time).
    A model with other kinds of KV (`pools`, by kind; `spec`, what they are) gets a store for
    each of its kinds in `store_classes` (kind -> store class; a kind not there is not kept in
    the tiers), whose host pool holds the same share of its device pool as FULL's."""
    if not cfg.tiers_enabled:
        return NoTiers()
    ps = cfg.page_size
    if cfg.hicache_size is not None:
        pages = HostKVPool.pages_for_bytes(pool, int(cfg.hicache_size * 2**20), ps)
    elif cfg.enable_hierarchical_cache:
        pages = 2 * pool.num_slots // ps
    else:
        pages = max(1, pool.num_slots // ps // 4)
    storage = None
    if cfg.hicache_storage_backend is not None:
        assert cfg.hicache_storage_url is not None
        storage = (cfg.hicache_storage_backend, cfg.hicache_storage_url)
    prefetch = PrefetchPolicy(
        cfg.hicache_storage_prefetch_policy, cfg.hicache_prefetch_timeout_s, chunk_tokens
    )
    fingerprint = model_fingerprint(lm, pool.config.dtype)
    policy, timeout_s = cfg.hicache_write_policy, cfg.hicache_storage_timeout_s
    stores: Sequence[KindStore] = ()
    if pools is not None:
        if pools.kv(FULL) is None:
            raise ValueError("host/storage cache tiers need a model with full-attention layers")
        interval = -(-cfg.state_checkpoint_interval // ps) * ps
        share = pages / max(1, pool.num_slots // ps)
        setup = StoreSetup(spec, ps, share, interval, fingerprint)
        stores = make_stores(pools, setup, store_classes or {})
    return TierManager(pool, ps, pages, policy, fingerprint, storage, timeout_s, prefetch, stores)


def make_stores(pools: ModelPools, setup: StoreSetup, classes: StoreClasses) -> list[KindStore]:
    """One store per kind of `pools` that `classes` names (FULL is the manager's own), in the
    order of `classes`."""
    return [make(pools[kind], setup) for kind, make in classes.items() if kind in pools]


class NoTiers:
    """The tiers when none are configured (a null object, so the KV manager and the engine call
    the tiers unconditionally): every hook does nothing, nothing is ever found or held."""

    has_storage = False

    def on_insert(self, req: Request, slots: np.ndarray, cached: int, aligned: int) -> None:
        pass

    def on_l1_hit(self, slots: np.ndarray) -> None:
        pass

    def on_evict(self, slots: np.ndarray, demote: bool = True) -> None:
        pass

    def on_kinds_insert(
        self, req: Request, parts: Mapping[str, Any], cached: int, aligned: int
    ) -> None:
        pass

    def plan_load(self, req: Request, length: int, l1_full: int = 0) -> LoadPlan | None:
        return None

    def load(
        self,
        plan: LoadPlan,
        dev_pages: list[int] | None,
        units: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        raise AssertionError("NoTiers never plans a load")

    def end_match(self, req: Request) -> None:
        pass

    def start_prefetch(self, req: Request, l1_tokens: int) -> float | None:
        return None

    def prefetch_pending(self, request_id: str) -> bool:
        return False

    def end_hold(self, request_id: str) -> None:
        pass

    def poll(self, timeout: float = 0.0) -> None:
        pass

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        pass

    def forget(self, req: Request) -> None:
        pass

    def loaded_split(self, req: Request) -> tuple[int, int]:
        return 0, 0

    def flush(self, device_reset: bool) -> None:
        pass

    def announce_residency(self) -> None:
        pass

    def residency_ops(self) -> list[TierOp]:
        return []

    def close(self, tree_pages: set[int], timeout_s: float = 5.0) -> bool:
        return True

    def stats(self) -> dict[str, Any]:
        return {}

    def check(self) -> None:
        pass

    def device_pages(self) -> set[int]:
        return set()


Tiers = TierManager | NoTiers

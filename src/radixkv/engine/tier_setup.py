"""Building the hierarchical cache from an EngineConfig: checks, L2 size, the model fingerprint."""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from radixkv.engine.tiers import PREFETCH_POLICIES, WRITE_POLICIES, TierManager
from radixkv.engine.types import EngineConfig
from radixkv.memory.host_pool import HostKVPool
from radixkv.memory.pool import KVPool

_SAMPLE = 4096  # values per tensor that enter the weights digest


def validate_tier_config(cfg: EngineConfig) -> None:
    if cfg.hicache_write_policy not in WRITE_POLICIES:
        raise ValueError(f"unknown hicache_write_policy {cfg.hicache_write_policy!r}")
    if cfg.hicache_storage_prefetch_policy not in PREFETCH_POLICIES:
        raise ValueError(
            f"unknown hicache_storage_prefetch_policy {cfg.hicache_storage_prefetch_policy!r}"
        )
    backend = cfg.hicache_storage_backend
    if backend not in (None, "file", "redis"):
        raise ValueError(f"unknown hicache_storage_backend {backend!r} (file | redis)")
    if backend is not None and not cfg.hicache_storage_url:
        raise ValueError(f"hicache_storage_backend={backend} needs hicache_storage_url")
    if cfg.hicache_size is not None and cfg.hicache_size <= 0:
        raise ValueError("hicache_size must be > 0 MiB")
    if cfg.tiers_enabled and not cfg.prefix_cache_enabled:
        raise ValueError(
            "the hierarchical cache needs the prefix cache (drop --disable-radix-cache)"
        )
    if cfg.tiers_enabled and cfg.cache != "radix":
        raise ValueError("the hierarchical cache needs cache='radix'")


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


def make_tiers(cfg: EngineConfig, pool: KVPool, lm: Any) -> TierManager | None:
    """The TierManager the config asks for, or None. Without enable_hierarchical_cache but with
    a storage backend, L2 is a staging area a quarter of the device pool (L3 without L2)."""
    if not cfg.tiers_enabled:
        return None
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
    return TierManager(
        pool,
        ps,
        pages,
        cfg.hicache_write_policy,
        model_fingerprint(lm, pool.config.dtype),
        storage,
        cfg.hicache_storage_timeout_s,
    )

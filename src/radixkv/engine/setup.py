"""Engine construction helpers: config checks, device/dtype resolution, model loading, pool
sizing, cache construction, and normalising generate() arguments."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from radixkv.cache.base import PrefixCache
from radixkv.engine.types import EngineConfig, SamplingParams
from radixkv.memory.pool import KVPoolConfig

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def validate_config(cfg: EngineConfig) -> None:
    if cfg.page_size < 1:
        raise ValueError("page_size must be >= 1")
    if cfg.schedule_policy not in ("lpm", "fcfs"):
        raise ValueError(f"unknown schedule_policy {cfg.schedule_policy!r} (lpm | fcfs)")
    if cfg.cache not in ("radix", "blockhash"):
        raise ValueError(f"unknown cache {cfg.cache!r} (radix | blockhash)")
    if cfg.chunked_prefill_size < 1:
        raise ValueError("chunked_prefill_size must be >= 1")
    if cfg.max_running_requests < 1 or cfg.max_queued_requests < 0:
        raise ValueError("max_running_requests must be >= 1, max_queued_requests >= 0")
    if cfg.state_checkpoint_interval < 1:
        raise ValueError("state_checkpoint_interval must be >= 1")
    if cfg.max_n < 1:
        raise ValueError("max_n must be >= 1")
    if cfg.num_slots is not None and cfg.num_slots < cfg.page_size:
        raise ValueError("num_slots must hold at least one page")


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r} ({', '.join(_DTYPES)})") from None


def is_loaded_model(model: Any) -> bool:
    return all(hasattr(model, a) for a in ("model", "config", "tokenizer"))


def load(path: str | None, device: str, dtype: torch.dtype) -> Any:
    from radixkv.model import load_model

    return load_model(path, device, dtype)


def num_slots(cfg: EngineConfig, model_config: Any, dtype: torch.dtype) -> int:
    """Pool size in slots (explicit, or from the byte budget), rounded down to whole pages."""
    n = cfg.num_slots
    if n is None:
        n = KVPoolConfig.slots_for_budget(
            cfg.kv_cache_bytes,
            int(model_config.num_layers),
            int(model_config.num_kv_heads),
            int(model_config.head_dim),
            dtype,
        )
    n = n // cfg.page_size * cfg.page_size
    if n < cfg.page_size:
        raise ValueError("the KV budget does not hold a single page")
    return n


def make_prefix_cache(cfg: EngineConfig, components: Any = None) -> PrefixCache | None:
    """The prefix cache; a hybrid model's `components` (cache.components.Components) need the
    radix tree, which holds every component on one tree."""
    if not cfg.prefix_cache_enabled:
        return None
    from radixkv.cache import RadixCache, make_cache

    if components is not None and components.hybrid:
        if cfg.cache != "radix":
            raise ValueError(f"hybrid models need --cache radix (got {cfg.cache!r})")
        return RadixCache(cfg.page_size, cfg.eviction_policy, components)
    cache: PrefixCache = make_cache(cfg.cache, cfg.page_size, cfg.eviction_policy)
    return cache


def hybrid_spec(model_config: Any, cfg: EngineConfig | None = None) -> Any:
    """The model's PoolSpec when it needs SWA or STATE pools, else None (FULL-only path).

    A model without FULL layers (Mistral: every layer sliding) still gets a FULL allocator and
    FULL slots in the tree, but over a pool of zero layers: they are token bookkeeping only (the
    tree's leaf-first eviction and the request table run on them), the K/V lives in SWA."""
    get = getattr(model_config, "pool_spec", None)
    spec = get() if callable(get) else None
    if spec is None or not (spec.has_swa or spec.has_state):
        return None
    if cfg is not None and cfg.cache != "radix" and not spec.has_full and not spec.has_state:
        # An all-sliding model with a cache that has no components (blockhash): the old path,
        # every layer's K/V in one FULL pool with the window applied by attention.
        return None
    return spec


def hybrid_sizes(cfg: EngineConfig, spec: Any, dtype: torch.dtype) -> tuple[int, int, int]:
    """(FULL slots, SWA slots, STATE slots) of a hybrid model's pools, whole pages."""
    ps = cfg.page_size
    full = cfg.num_slots
    full_b, swa_b = spec.kv_bytes_per_token(dtype)
    if full is None:
        full = max(1, cfg.kv_cache_bytes // (full_b + swa_b))
    swa = cfg.swa_num_slots if cfg.swa_num_slots is not None else full
    if not spec.has_full and cfg.num_slots is None:
        full = 8 * swa  # virtual FULL slots (no tensor): how many tokens can be tracked
    state = cfg.state_num_slots
    if state is None:
        state = 2 * cfg.max_running_requests + 32
    full, swa = full // ps * ps, swa // ps * ps
    if full < ps:
        raise ValueError("the KV budget does not hold a single page")
    if spec.has_swa:
        least = -(-(spec.swa_window + cfg.chunked_prefill_size) // ps) * ps + 2 * ps
        if swa < least:
            raise ValueError(f"the SWA pool needs at least {least} slots (window + one chunk)")
    if spec.has_state and state < 2:
        raise ValueError("the STATE pool needs at least 2 slots")
    return full, swa, state


def normalize_prompts(prompts: Any) -> list[str | list[int]]:
    """str | list[int] | list[str] | list[list[int]] → a list of single prompts."""
    if isinstance(prompts, str):
        return [prompts]
    items = list(prompts)
    if not items:
        return []
    if all(isinstance(t, int) for t in items):
        return [[int(t) for t in items]]
    out: list[str | list[int]] = []
    for p in items:
        out.append(p if isinstance(p, str) else [int(t) for t in p])
    return out


def normalize_sampling(
    sampling: SamplingParams | Sequence[SamplingParams] | None, n: int
) -> list[SamplingParams]:
    if sampling is None:
        return [SamplingParams()] * n
    if isinstance(sampling, SamplingParams):
        return [sampling] * n
    params = list(sampling)
    if len(params) != n:
        raise ValueError(f"{len(params)} SamplingParams for {n} prompts")
    return params

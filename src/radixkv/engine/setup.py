"""Engine construction helpers (the configuration itself is checked by radixkv.config): device
and dtype resolution, model loading, a FULL-only model's pool size (a hybrid model's pools are
sized by kind: radixkv.engine.kv.kinds.pool_sizes), cache construction, normalising generate()
arguments."""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from radixkv.cache.base import PrefixCache
from radixkv.cache.hybrid.components import Components, HybridPrefixCache
from radixkv.config import CacheConfig, EngineConfig
from radixkv.engine.types import SamplingParams
from radixkv.memory.hybrid import FULL, SWA
from radixkv.memory.pool import KVPoolConfig

if TYPE_CHECKING:
    from radixkv.cache.policies.research.regret import RegretWindow

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


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 dot products natively (AVX512-BF16 or AMX-BF16), from
    the Linux flags in /proc/cpuinfo (False where they cannot be read)."""
    from radixkv.model.kernels.paths import cpu_flags

    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """`auto`: bfloat16 on accelerators; on CPU bfloat16 only where the CPU has native bf16
    (there its GEMMs read half the bytes at full speed, and decode is memory-bound), float32
    elsewhere (emulated bf16 is slower than float32). $RADIXKV_AUTO_BF16=0 keeps CPU on float32."""
    if dtype == "auto":
        if torch.device(device).type != "cpu":
            return torch.bfloat16
        native = cpu_has_native_bf16() and os.environ.get("RADIXKV_AUTO_BF16", "1") != "0"
        return torch.bfloat16 if native else torch.float32
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r} ({', '.join(_DTYPES)})") from None


def is_loaded_model(model: Any) -> bool:
    return all(hasattr(model, a) for a in ("model", "config", "tokenizer"))


def load(path: str | None, device: str, dtype: torch.dtype) -> Any:
    from radixkv.model import load_model

    return load_model(path, device, dtype)


def eos_token_ids(model_config: Any, tokenizer: Any) -> frozenset[int]:
    """The ids that end a generation: the model config's and the tokenizer's, together."""
    return frozenset(
        int(t)
        for t in itertools.chain(
            getattr(model_config, "eos_token_ids", ()) or (),
            getattr(tokenizer, "eos_token_ids", ()) or (),
        )
    )


def make_regret_window(cfg: CacheConfig, cache: Any, num_slots: int) -> RegretWindow | None:
    """The live regret window the config asks for (None when off, or without a prefix cache)."""
    if cache is None or cfg.regret_window <= 0:
        return None
    from radixkv.cache.policies.research.regret import RegretWindow

    return RegretWindow(cfg.page_size, num_slots, max_requests=cfg.regret_window)


def num_slots(cfg: CacheConfig, model_config: Any, dtype: torch.dtype) -> int:
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


def make_prefix_cache(cfg: CacheConfig) -> PrefixCache | None:
    """The FULL-only prefix cache of `cfg.kind` (None when prefix caching is off)."""
    if not cfg.prefix_cache_enabled:
        return None
    from radixkv.cache import make_cache

    return make_cache(cfg.kind, cfg.page_size, cfg.eviction_policy)


def make_hybrid_cache(cfg: CacheConfig, components: Components) -> HybridPrefixCache | None:
    """A hybrid model's prefix cache: the hybrid radix tree, which holds every component on
    one tree (None when prefix caching is off)."""
    if not cfg.prefix_cache_enabled:
        return None
    if cfg.kind != "radix":
        raise ValueError(f"hybrid models need --cache radix (got {cfg.kind!r})")
    from radixkv.cache import HybridCache

    return HybridCache(components, cfg.page_size, cfg.eviction_policy)


def hybrid_spec(model_config: Any, cfg: EngineConfig | None = None) -> Any:
    """The model's PoolSpec when it has a kind of memory besides FULL, else None (FULL-only).

    A model without FULL layers (Mistral: every layer sliding) still gets a FULL allocator and
    FULL slots in the tree, but over a pool of zero layers: they are token bookkeeping only (the
    tree's leaf-first eviction and the request table run on them), the K/V lives in SWA."""
    get = getattr(model_config, "pool_spec", None)
    spec = get() if callable(get) else None
    if spec is None or not set(spec.kinds) - {FULL}:
        return None
    if cfg is not None and cfg.cache.kind != "radix" and spec.kinds == (SWA,):
        # An all-sliding model with a cache that has no components (blockhash): the old path,
        # every layer's K/V in one FULL pool with the window applied by attention.
        return None
    return spec


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

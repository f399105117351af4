"""radixkv.cache: prefix caches mapping token prefixes to KV slot indices (metadata only).

Never imports torch. `RadixCache` is the radix tree, `BlockHashCache` the vLLM-style peer;
`make_cache(kind, page_size, policy)` builds either design by name ("radix" or "blockhash").
"""

from __future__ import annotations

from radixkv.cache.base import CacheStats, MatchResult, PrefixCache
from radixkv.cache.blockhash import BlockHashCache
from radixkv.cache.policies import EvictionPolicy, available_policies, make_policy, register_policy
from radixkv.cache.radix import RadixCache

CACHE_KINDS = ("radix", "blockhash")


def make_cache(kind: str = "radix", page_size: int = 1, policy: str = "lru") -> PrefixCache:
    """Build a prefix cache by name: "radix" (RadixCache) or "blockhash" (BlockHashCache)."""
    if kind == "radix":
        return RadixCache(page_size=page_size, policy=policy)
    if kind == "blockhash":
        return BlockHashCache(page_size=page_size, policy=policy)
    raise ValueError(f"unknown cache kind {kind!r}; choose one of {CACHE_KINDS}")


__all__ = [
    "CACHE_KINDS",
    "BlockHashCache",
    "CacheStats",
    "EvictionPolicy",
    "MatchResult",
    "PrefixCache",
    "RadixCache",
    "available_policies",
    "make_cache",
    "make_policy",
    "register_policy",
]

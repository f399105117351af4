"""radixkv.cache: prefix caches mapping token prefixes to KV slot indices (metadata only).

Never imports torch. `RadixCache` is the radix tree, `BlockHashCache` the vLLM-style peer;
`make_cache(kind, page_size, policy)` builds either design by name ("radix" or "blockhash").
`HybridCache` is the radix tree of a hybrid model (FULL / SWA / STATE components), on the same
tree core (`tree.RadixTree`) as `RadixCache`, built from `ComponentSpec`s (the engine's registry
of kinds answers them; by hand, names: `parse_components(["full", "swa:4096", "state"])`).
"""

from __future__ import annotations

from radixkv.cache.base import CacheStats, InsertResult, MatchResult, PrefixCache, PrefixIndex
from radixkv.cache.blockhash import BlockHashCache
from radixkv.cache.hybrid.cache import HybridCache
from radixkv.cache.hybrid.component import ComponentSpec
from radixkv.cache.hybrid.components import Components, HybridMatch, HybridPrefixCache
from radixkv.cache.hybrid.names import parse_components
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
    "ComponentSpec",
    "Components",
    "EvictionPolicy",
    "HybridCache",
    "HybridMatch",
    "HybridPrefixCache",
    "InsertResult",
    "MatchResult",
    "PrefixCache",
    "PrefixIndex",
    "RadixCache",
    "available_policies",
    "make_cache",
    "make_policy",
    "parse_components",
    "register_policy",
]

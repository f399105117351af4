"""Choosing an L3 backend by kind: the one place that knows every backend module (each imports
only radixkv.storage.base, so the backends and their interface depend one way)."""

from __future__ import annotations

from radixkv.storage.base import StorageBackend


def make_backend(kind: str, url: str, timeout_s: float = 1.0) -> StorageBackend:
    """`file` takes a directory; `redis` takes redis://host:port[/db] (Redis or Valkey), or
    redis-cluster://host:port[,host:port...] (a Redis Cluster; `rediss-` for TLS); `mooncake`
    takes the master's host:port or a JSON config file (empty: SGLang's MOONCAKE_* variables)."""
    if kind == "file":
        from radixkv.storage.file import FileBackend

        return FileBackend(url)
    if kind == "redis":
        from radixkv.storage.redis_cluster import is_cluster_url

        if is_cluster_url(url):
            from radixkv.storage.redis_cluster import RedisClusterBackend

            return RedisClusterBackend(url, timeout_s)
        from radixkv.storage.redis_backend import RedisBackend

        return RedisBackend(url, timeout_s)
    if kind == "mooncake":
        from radixkv.storage.mooncake_backend import MooncakeBackend, MooncakeConfig

        return MooncakeBackend(MooncakeConfig.load(url))
    raise ValueError(f"unknown storage backend {kind!r} (file | redis | mooncake)")

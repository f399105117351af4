"""Redis / Valkey backend through the `redis` client: SET / GET / DEL with socket timeouts.

A SET that returned OK is a confirmed write. Connection errors and timeouts raise StorageError.
Keys are prefixed (`rkv:`) so the cache can share a database with other data.
"""

from __future__ import annotations

from typing import Any

import redis

from radixkv.storage.base import StorageError

PREFIX = "rkv:"


class RedisBackend:
    name = "redis"

    def __init__(self, url: str, timeout_s: float = 1.0) -> None:
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"redis storage wants redis://host:port[/db], got {url!r}")
        self.url = url
        self._client: Any = redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry_on_timeout=False,
            health_check_interval=0,
        )

    def _call(self, op: str, *args: Any) -> Any:
        try:
            return getattr(self._client, op)(*args)
        except (redis.exceptions.RedisError, OSError) as exc:
            raise StorageError(f"redis {op} failed: {type(exc).__name__}: {exc}") from exc

    def put(self, key: str, value: bytes) -> None:
        if self._call("set", PREFIX + key, value) is not True:
            raise StorageError("redis SET was not acknowledged")

    def get(self, key: str) -> bytes | None:
        value = self._call("get", PREFIX + key)
        return None if value is None else bytes(value)

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        values = self._call("mget", [PREFIX + k for k in keys])
        return [None if v is None else bytes(v) for v in values]

    def delete(self, key: str) -> None:
        self._call("delete", PREFIX + key)

    def close(self) -> None:
        self._client.close()

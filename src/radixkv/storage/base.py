"""The L3 backend interface: put / get / delete of opaque values by string key.

Contract: `put` returns only once the value is durably stored (the backend confirmed the write);
any failure raises StorageError (never a partial value under the key). `get` returns the stored
bytes or None when absent; a backend that cannot answer raises StorageError. Every call is bounded
by the backend's timeout.
"""

from __future__ import annotations

from typing import Protocol


class StorageError(RuntimeError):
    """The backend failed or timed out (down, full disk, connection refused...)."""


class PartialOutage(StorageError):
    """One part of a sharded store (a Redis Cluster node) is unreachable: this call failed, but
    the rest of the store still answers, so the backend as a whole stays healthy."""


class StorageBackend(Protocol):
    name: str

    def put(self, key: str, value: bytes) -> None: ...

    def get(self, key: str) -> bytes | None: ...

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        """`get` of several keys in one round trip where the backend can (Redis MGET)."""
        ...

    def delete(self, key: str) -> None: ...

    def close(self) -> None: ...

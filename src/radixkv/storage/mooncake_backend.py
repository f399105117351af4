"""Mooncake Store backend (`--hicache-storage-backend mooncake`, SGLang's name for it).

Configured as SGLang's Mooncake HiCache backend is, so an existing deployment's settings carry
over: the environment variables MOONCAKE_MASTER, MOONCAKE_TE_META_DATA_SERVER,
MOONCAKE_GLOBAL_SEGMENT_SIZE, MOONCAKE_LOCAL_BUFFER_SIZE, MOONCAKE_PROTOCOL, MOONCAKE_DEVICE,
MOONCAKE_LOCAL_HOSTNAME, or a JSON file (path in SGLANG_HICACHE_MOONCAKE_CONFIG_PATH or given
as `--hicache-storage-url`) with the keys master_server_address, metadata_server,
global_segment_size, local_buffer_size, protocol, device_name, local_hostname. A
`--hicache-storage-url host:port` names the master. Precedence: URL > JSON file > environment >
defaults (SGLang's: P2PHANDSHAKE metadata, a 4 GB segment, tcp).

Values are the same checksummed pages as in every backend, under `rkv:`-prefixed keys. Mooncake
answers an absent key and a failed read alike (empty bytes), so the first empty value of a
batch is classified with `is_exist`: absent -> a miss; present or a negative code (master
unreachable) -> StorageError, which the worker turns into a backoff and recomputation.

`setup` against an unreachable master retries for about 90 s inside Mooncake without releasing
the GIL, so it is attempted only once the master (and an HTTP metadata server) accept a TCP
connection, on a background thread: the constructor waits `connect_wait_s` at most, and until
setup succeeds every call raises StorageError (a later call starts another attempt).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from radixkv.storage.base import StorageError

log = logging.getLogger(__name__)

PREFIX = "rkv:"
_ENV = {
    "master_server_address": "MOONCAKE_MASTER",
    "metadata_server": "MOONCAKE_TE_META_DATA_SERVER",
    "global_segment_size": "MOONCAKE_GLOBAL_SEGMENT_SIZE",
    "local_buffer_size": "MOONCAKE_LOCAL_BUFFER_SIZE",
    "protocol": "MOONCAKE_PROTOCOL",
    "device_name": "MOONCAKE_DEVICE",
    "local_hostname": "MOONCAKE_LOCAL_HOSTNAME",
}
CONFIG_PATH_ENV = "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH"
_NOT_FOUND = -704  # Mooncake's OBJECT_NOT_FOUND
_LEASED = -706  # the object is leased to a recent reader: removal refused for now


def parse_size(value: object) -> int:
    """Bytes from an int or a string such as "4gb", "512 MB", "16777216"."""
    if isinstance(value, int):
        return value
    s = str(value).strip().lower().replace(" ", "").removesuffix("b")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}.get(s[-1:], 1)
    num = s[:-1] if mult > 1 else s
    try:
        return int(float(num) * mult)
    except ValueError:
        raise ValueError(f"bad size {value!r} (bytes, or a number with kb/mb/gb)") from None


@dataclass(frozen=True)
class MooncakeConfig:
    master_server_address: str = ""
    metadata_server: str = "P2PHANDSHAKE"
    global_segment_size: int = 4 << 30
    local_buffer_size: int = 64 << 20
    protocol: str = "tcp"
    device_name: str = ""
    local_hostname: str = "localhost"

    @classmethod
    def load(cls, url: str | None = None, env: dict[str, str] | None = None) -> MooncakeConfig:
        """Defaults < environment < JSON file < URL (a master address or a JSON file path)."""
        env = dict(os.environ) if env is None else env
        vals: dict[str, Any] = {f: env[e] for f, e in _ENV.items() if env.get(e)}
        path = env.get(CONFIG_PATH_ENV)
        url = (url or "").strip().removeprefix("mooncake://")
        if url.endswith(".json") or (url and Path(url).is_file()):
            path, url = url, ""
        if path:
            try:
                data = json.loads(Path(path).read_text())
            except (OSError, ValueError) as exc:
                raise ValueError(f"cannot read the Mooncake config {path}: {exc}") from exc
            known = {f.name for f in fields(cls)}
            vals.update({k: v for k, v in data.items() if k in known and v is not None})
        if url:
            vals["master_server_address"] = url
        cfg = cls()
        for k in ("global_segment_size", "local_buffer_size"):
            if k in vals:
                vals[k] = parse_size(vals[k])
        cfg = replace(cfg, **vals)
        if not cfg.master_server_address:
            raise ValueError(
                "mooncake storage needs the master: --hicache-storage-url HOST:PORT, "
                f"MOONCAKE_MASTER, or a JSON config file ({CONFIG_PATH_ENV})"
            )
        return cfg


class MooncakeBackend:
    name = "mooncake"

    def __init__(self, config: MooncakeConfig, connect_wait_s: float = 10.0) -> None:
        try:
            from mooncake.store import MooncakeDistributedStore
        except ImportError as exc:
            raise StorageError(
                "mooncake storage needs the Mooncake client: pip install "
                "mooncake-transfer-engine (mooncake-transfer-engine-non-cuda without CUDA)"
            ) from exc
        self.config = config
        self._factory = MooncakeDistributedStore
        self._store: Any = None
        self._connecting: threading.Thread | None = None
        self._lock = threading.Lock()
        self._per_batch = 1  # keys per get_batch; grows once a value's size is known
        self._connect()
        if self._connecting is not None:
            self._connecting.join(connect_wait_s)

    # -- connection ----------------------------------------------------------------------------
    def _connect(self) -> None:
        with self._lock:
            if self._store is not None or self._connecting is not None:
                return
            self._connecting = threading.Thread(
                target=self._setup, daemon=True, name="radixkv-mooncake-setup"
            )
            self._connecting.start()

    def _reachable(self) -> bool:
        """The master (and an HTTP metadata server) accept connections. Checked first because
        Mooncake's setup retries an unreachable master for ~90 s holding the GIL."""
        c = self.config
        addrs = [c.master_server_address]
        if c.metadata_server.startswith("http://"):
            addrs.append(urlsplit(c.metadata_server).netloc)
        for addr in addrs:
            host, _, port = addr.rpartition(":")
            try:
                with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                    pass
            except (OSError, ValueError):
                return False
        return True

    def _setup(self) -> None:
        c = self.config
        if not self._reachable():
            with self._lock:
                self._connecting = None
            return
        store = self._factory()
        try:
            rc = store.setup(
                c.local_hostname,
                c.metadata_server,
                c.global_segment_size,
                c.local_buffer_size,
                c.protocol,
                c.device_name,
                c.master_server_address,
            )
        except Exception:
            rc = -1
        if rc != 0:
            log.warning("mooncake setup with master %s failed (%s)", c.master_server_address, rc)
        with self._lock:
            self._connecting = None
            if rc == 0:
                self._store = store

    def _live(self) -> Any:
        store = self._store
        if store is None:
            self._connect()
            raise StorageError(
                f"mooncake master {self.config.master_server_address} not connected (yet)"
            )
        return store

    # -- the storage interface -----------------------------------------------------------------
    def put(self, key: str, value: bytes) -> None:
        """An upsert: Mooncake's put keeps an existing value, so a page rewritten after a
        failed verification would keep its bad bytes."""
        rc = self._live().upsert(PREFIX + key, value)
        if rc != 0:
            raise StorageError(f"mooncake upsert returned {rc}")

    def get(self, key: str) -> bytes | None:
        return self.get_many([key])[0]

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        """Batched reads sized to the local transfer buffer (a batch larger than it fails
        whole); stops at the first absent key, the rest read as misses."""
        store = self._live()
        out: list[bytes | None] = []
        size = 0
        while len(out) < len(keys):
            batch = [PREFIX + k for k in keys[len(out) : len(out) + self._per_batch]]
            values = store.get_batch(batch) if len(batch) > 1 else [store.get(batch[0])]
            for name, v in zip(batch, values, strict=True):
                if not v:
                    self._classify_empty(store, name)  # raises unless simply absent
                    return out + [None] * (len(keys) - len(out))
                out.append(bytes(v))
                size = len(v)
            self._per_batch = max(1, min(64, self.config.local_buffer_size // (2 * size)))
        return out

    @staticmethod
    def _classify_empty(store: Any, name: str) -> None:
        exists = store.is_exist(name)
        if exists < 0:
            raise StorageError(f"mooncake master unreachable (is_exist returned {exists})")
        if exists == 1:
            raise StorageError(f"mooncake read of {name} failed (object present)")

    def delete(self, key: str) -> None:
        """Best effort where Mooncake refuses removal of a leased object: the caller already
        treats the value as a miss, and the next write of the key replaces it."""
        rc = self._live().remove(PREFIX + key)
        if rc not in (0, _NOT_FOUND, _LEASED):
            raise StorageError(f"mooncake remove returned {rc}")

    def close(self) -> None:
        """Bounded: Mooncake's teardown pings a dead master for ~10 s, so it runs on a daemon
        thread that gets 2 s."""
        store, self._store = self._store, None
        if store is not None:
            t = threading.Thread(target=store.close, daemon=True, name="radixkv-mooncake-close")
            t.start()
            t.join(2.0)

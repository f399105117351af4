"""Redis Cluster backend: the Redis L3 sharded over a cluster's nodes (`redis-py`'s RedisCluster).

Chosen by the URL scheme: `redis-cluster://[user:password@]host:port[,host:port...]` (any
reachable nodes seed the topology; `rediss-cluster://` for TLS), the convention of Redis clients
that take one URL for standalone and cluster servers.

Keys carry no hash tag, so a prefix's pages spread over every slot and node: the load and the
memory of a popular prefix are shared by all nodes. A tag could only come from the key itself
(the storage interface gives the backend nothing else), and a per-key tag is no tag. Hence a
batch read groups its keys by node and sends one pipeline of GETs per node (a multi-key MGET
across slots is refused by the cluster).

Faults are per node. A node that refuses, times out or answers CLUSTERDOWN is marked down for a
backoff (doubling, capped); meanwhile its keys read as misses and writes to them raise
PartialOutage without touching the network, while the other nodes keep serving. Only when every
node is down does a call raise StorageError (the worker then backs off the whole store). The
topology is re-read (CLUSTER SLOTS) after a node fails and after MOVED/ASK answers, so a
resharded or failed-over cluster is followed.
"""

from __future__ import annotations

import threading
import time
from typing import Any
from urllib.parse import unquote

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

from radixkv.storage.base import PartialOutage, StorageError

PREFIX = "rkv:"
SCHEMES = ("redis-cluster://", "rediss-cluster://")
# RedisClusterException ("cannot be connected", raised while re-reading the topology) is not a
# RedisError.
_NODE_ERRORS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.RedisClusterException,
    OSError,
)
_ERRORS = (redis.exceptions.RedisError, *_NODE_ERRORS)


def is_cluster_url(url: str) -> bool:
    return url.startswith(SCHEMES)


def parse_cluster_url(url: str) -> dict[str, Any]:
    """Seed nodes, credentials and TLS of a redis-cluster:// URL; ValueError when malformed."""
    if not is_cluster_url(url):
        raise ValueError(f"a Redis Cluster URL starts with {' or '.join(SCHEMES)}, got {url!r}")
    rest = url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0]
    creds, _, hosts = rest.rpartition("@")
    out: dict[str, Any] = {"ssl": url.startswith("rediss"), "nodes": []}
    if creds:
        user, _, password = creds.partition(":")
        out["username"], out["password"] = unquote(user) or None, unquote(password) or None
    for hp in hosts.split(","):
        host, _, port = hp.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"bad node {hp!r} in {url!r} (want host:port[,host:port...])")
        out["nodes"].append((host.strip("[]"), int(port)))
    return out


class RedisClusterBackend:
    name = "redis-cluster"

    def __init__(self, url: str, timeout_s: float = 1.0, node_retry_s: float = 1.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.node_retry_s = node_retry_s
        self._opts = parse_cluster_url(url)
        self._client: Any = None  # connected lazily: a cluster down at startup is not fatal
        self._lock = threading.Lock()
        self._down: dict[str, tuple[float, float]] = {}  # node name -> (retry at, backoff)
        self._refresh_at = 0.0  # re-read the topology at this time (0: not needed)

    # -- topology and node health --------------------------------------------------------------
    def _cluster(self) -> Any:
        if self._client is None:
            o = self._opts
            try:
                self._client = RedisCluster(
                    startup_nodes=[ClusterNode(h, p) for h, p in o["nodes"]],
                    username=o.get("username"),
                    password=o.get("password"),
                    ssl=o["ssl"],
                    socket_timeout=self.timeout_s,
                    socket_connect_timeout=self.timeout_s,
                    retry=Retry(NoBackoff(), 0),
                    require_full_coverage=False,
                    health_check_interval=0,
                )
            except _ERRORS as exc:
                raise StorageError(f"redis cluster unreachable: {exc}") from exc
        elif self._refresh_at and time.monotonic() >= self._refresh_at:
            self._refresh_at = 0.0
            try:
                self._client.nodes_manager.initialize()
            except _ERRORS:
                self._refresh_at = time.monotonic() + self.node_retry_s
        return self._client

    def _is_down(self, node: str) -> bool:
        with self._lock:
            entry = self._down.get(node)
            return entry is not None and time.monotonic() < entry[0]

    def _mark_down(self, node: str) -> None:
        with self._lock:
            backoff = min(self._down.get(node, (0.0, self.node_retry_s / 2))[1] * 2, 30.0)
            self._down[node] = (time.monotonic() + backoff, backoff)
            self._refresh_at = self._refresh_at or time.monotonic()

    def _mark_up(self, node: str) -> None:
        if node in self._down:
            with self._lock:
                self._down.pop(node, None)

    def _all_down(self, client: Any) -> bool:
        names = [n.name for n in client.get_primaries()]
        return bool(names) and all(self._is_down(n) for n in names)

    def _node_of(self, client: Any, key: str) -> Any:
        """The primary that owns `key`'s slot, or None (slot not covered)."""
        try:
            return client.nodes_manager.get_node_from_slot(client.keyslot(key))
        except (*_ERRORS, IndexError, KeyError):
            return None

    def _node_failed(self, client: Any, node: Any, exc: Exception) -> StorageError:
        self._mark_down(node.name)
        msg = f"redis cluster node {node.name}: {type(exc).__name__}: {exc}"
        return StorageError(msg) if self._all_down(client) else PartialOutage(msg)

    # -- the storage interface -----------------------------------------------------------------
    def put(self, key: str, value: bytes) -> None:
        client = self._cluster()
        node = self._node_of(client, PREFIX + key)
        if node is None or self._is_down(node.name):
            if self._all_down(client):
                raise StorageError("every redis cluster node is down")
            raise PartialOutage(f"redis cluster: the node of {key} is down")
        try:
            ok = client.set(PREFIX + key, value)  # follows MOVED / ASK itself
        except _NODE_ERRORS as exc:
            raise self._node_failed(client, node, exc) from exc
        except redis.exceptions.RedisError as exc:  # CLUSTERDOWN, TRYAGAIN, OOM...
            self._refresh_at = self._refresh_at or time.monotonic()
            raise PartialOutage(f"redis cluster SET failed: {exc}") from exc
        if ok is not True:
            raise StorageError("redis cluster SET was not acknowledged")
        self._mark_up(node.name)

    def get(self, key: str) -> bytes | None:
        return self.get_many([key])[0]

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        """One pipeline of GETs per node; keys of down nodes (or answered with an error such as
        MOVED) read as misses. StorageError only when no node could answer at all."""
        client = self._cluster()
        groups: dict[str, tuple[Any, list[int]]] = {}
        for i, key in enumerate(keys):
            node = self._node_of(client, PREFIX + key)
            if node is not None and not self._is_down(node.name):
                groups.setdefault(node.name, (node, []))[1].append(i)
        out: list[bytes | None] = [None] * len(keys)
        answered = 0
        for node, idxs in groups.values():
            try:
                values = self._read_node(client, node, [PREFIX + keys[i] for i in idxs])
            except StorageError:
                continue
            answered += 1
            for i, v in zip(idxs, values, strict=True):
                out[i] = v
        if not answered and self._all_down(client):
            raise StorageError("every redis cluster node is down")
        return out

    def _read_node(self, client: Any, node: Any, keys: list[str]) -> list[bytes | None]:
        conn = client.get_redis_connection(node)
        pipe = conn.pipeline(transaction=False)
        for k in keys:
            pipe.get(k)
        try:
            replies = pipe.execute(raise_on_error=False)
        except _ERRORS as exc:
            raise self._node_failed(client, node, exc) from exc
        self._mark_up(node.name)
        out: list[bytes | None] = []
        for r in replies:
            if isinstance(r, Exception):  # MOVED / ASK / CLUSTERDOWN for this key: a miss
                self._refresh_at = self._refresh_at or time.monotonic()
                out.append(None)
            else:
                out.append(None if r is None else bytes(r))
        return out

    def delete(self, key: str) -> None:
        client = self._cluster()
        node = self._node_of(client, PREFIX + key)
        if node is None or self._is_down(node.name):
            return  # unreachable: nothing will read it until the node is back; verified then
        try:
            client.delete(PREFIX + key)
        except _NODE_ERRORS as exc:
            raise self._node_failed(client, node, exc) from exc
        except redis.exceptions.RedisError as exc:
            raise PartialOutage(f"redis cluster DEL failed: {exc}") from exc

    def node_names(self) -> list[str]:
        """host:port of every primary (for tests and the benchmark)."""
        return sorted(n.name for n in self._cluster().get_primaries())

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

"""L3 on a real 3-node Redis Cluster on loopback: URL parsing, keys spread over the nodes, two
engines sharing prefixes, and a node killed mid-run (its pages miss and are recomputed, the other
nodes keep serving; outputs always equal the cache-off reference)."""

from __future__ import annotations

import pytest
from tier_helpers import reference, run_one_by_one, tier_engine

from radixkv.engine.engine import Engine
from radixkv.storage import PageMeta, decode_page, encode_page, make_backend
from radixkv.storage.base import PartialOutage, StorageError
from radixkv.storage.local_services import RedisClusterProcs
from radixkv.storage.redis_cluster import RedisClusterBackend, parse_cluster_url


def test_cluster_url_parsing() -> None:
    o = parse_cluster_url("rediss-cluster://bob:s%40cret@10.0.0.1:7000,[::1]:7001")
    assert o["ssl"] and o["username"] == "bob" and o["password"] == "s@cret"
    assert o["nodes"] == [("10.0.0.1", 7000), ("::1", 7001)]
    assert parse_cluster_url("redis-cluster://h:1")["ssl"] is False
    for bad in ("redis://h:1", "redis-cluster://h", "redis-cluster://h:1,:2"):
        with pytest.raises(ValueError):
            parse_cluster_url(bad)
    assert isinstance(make_backend("redis", "redis-cluster://127.0.0.1:1"), RedisClusterBackend)


def cluster_engine(cluster: RedisClusterProcs, **kw: object) -> Engine:
    args: dict[str, object] = {
        "hicache_storage_backend": "redis",
        "hicache_storage_url": cluster.url,
        "hicache_storage_prefetch_policy": "wait_complete",
        "hicache_storage_timeout_s": 2.0,  # a killed node refuses at once; a busy machine is slow
    }
    args.update(kw)
    return tier_engine(**args)


def test_backend_round_trip_spreads_keys_over_nodes(redis_cluster: RedisClusterProcs) -> None:
    b = make_backend("redis", redis_cluster.url, 2.0)
    meta = PageMeta("fp", "float32", 2, 4, (2, 4), 16)
    keys = [f"{i:032x}" for i in range(90)]
    for i, k in enumerate(keys):
        b.put(k, encode_page(k, meta, bytes([i]) * 16))
    got = b.get_many([*keys, "absent"])
    assert got[-1] is None
    assert [decode_page(k, meta, v or b"") for k, v in zip(keys, got, strict=False)] == [
        bytes([i]) * 16 for i in range(90)
    ]
    per_node = redis_cluster.keys_per_node()
    assert len(per_node) == 3 and all(n >= 10 for n in per_node.values()), per_node
    b.delete(keys[0])
    assert b.get(keys[0]) is None
    b.close()


def test_two_engines_share_prefixes_through_the_cluster(
    redis_cluster: RedisClusterProcs,
) -> None:
    want = reference()
    a = cluster_engine(redis_cluster)
    assert run_one_by_one(a) == want
    assert a.close()  # flushes its L3 writes
    assert all(n > 0 for n in redis_cluster.keys_per_node().values())
    b = cluster_engine(redis_cluster)  # a new replica: empty tree, empty L2
    assert run_one_by_one(b) == want
    assert b.metrics().cached_tokens_by_tier["storage"] > 0
    assert b.metrics().tier_stats["storage_corrupt"] == 0
    assert b.close()


def test_node_killed_mid_run_misses_its_pages_only(redis_cluster: RedisClusterProcs) -> None:
    want, want2 = reference(), reference(seed=2)
    a = cluster_engine(redis_cluster)
    assert run_one_by_one(a, n=3) == want[:3]
    assert a.tiers is not None and a.tiers.worker is not None
    assert a.tiers.worker.drain_writes(10.0)
    redis_cluster.kill(redis_cluster.ports[1])
    assert run_one_by_one(a) == want  # never a wrong answer, never a crash
    assert run_one_by_one(a, seed=2) == want2
    stats = a.metrics().tier_stats
    assert stats["storage_healthy"] == 1  # two nodes still serve: the store stays in use
    assert stats["storage_errors"] >= 1 and stats["storage_unhealthy_events"] == 0
    assert a.close(timeout_s=2.0)
    b = cluster_engine(redis_cluster)  # a replica started while the node is down
    assert run_one_by_one(b) == want and run_one_by_one(b, seed=2) == want2
    assert b.metrics().cached_tokens_by_tier["storage"] > 0  # the surviving nodes' pages
    b.close(timeout_s=2.0)


def test_dead_node_is_a_miss_and_all_dead_is_an_error(redis_cluster: RedisClusterProcs) -> None:
    b = RedisClusterBackend(redis_cluster.url, 2.0)
    keys = [f"k{i}" for i in range(60)]
    for k in keys:
        b.put(k, b"v" + k.encode())
    dead = f"127.0.0.1:{redis_cluster.ports[0]}"
    redis_cluster.kill(redis_cluster.ports[0])
    got = b.get_many(keys)  # the first read finds the node dead
    got = b.get_many(keys)  # later ones skip it without a network call
    lost = [k for k, v in zip(keys, got, strict=True) if v is None]
    assert 0 < len(lost) < len(keys)
    assert all(v == b"v" + k.encode() for k, v in zip(keys, got, strict=True) if v is not None)
    assert all(b._node_of(b._cluster(), "rkv:" + k).name == dead for k in lost)
    with pytest.raises(PartialOutage):
        b.put(lost[0], b"x")
    for port in redis_cluster.ports[1:]:
        redis_cluster.kill(port)
    with pytest.raises(StorageError):
        for _ in range(3):  # each live node is found dead on its first use
            b.get_many(keys)
    b.close()

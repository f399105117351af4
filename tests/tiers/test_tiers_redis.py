"""L3 on a real redis-server (started on a free port per test): restart and sharing between two
engines, and faults: killed, frozen (every call times out), restarted empty, corrupt values.
In every case requests finish with the cache-off output."""

from __future__ import annotations

import time

from redis_proc import RedisServer
from tier_helpers import reference, run_one_by_one, tier_engine

from radixkv.engine.engine import Engine
from radixkv.storage import decode_page


def redis_engine(srv: RedisServer, **kw: object) -> Engine:
    args: dict[str, object] = {
        "hicache_storage_backend": "redis",
        "hicache_storage_url": srv.url,
        "hicache_storage_prefetch_policy": "wait_complete",
        "hicache_storage_timeout_s": 0.3,
    }
    args.update(kw)
    return tier_engine(**args)


def test_two_servers_share_prefixes_through_redis(redis_server: RedisServer) -> None:
    want = reference()
    a = redis_engine(redis_server)
    b = redis_engine(redis_server)  # a second server on the same Redis
    assert run_one_by_one(a) == want
    assert a.tiers is not None and a.tiers.worker is not None
    assert a.tiers.worker.drain_writes(10.0)
    assert run_one_by_one(b) == want
    assert b.metrics().cached_tokens_by_tier["storage"] > 0
    assert redis_server.client().dbsize() > 0
    a.close()
    b.close()


def test_redis_killed_mid_run_then_back(redis_server: RedisServer) -> None:
    want = reference()
    e = redis_engine(redis_server)
    e.tiers.worker.retry_base_s = e.tiers.worker.retry_max_s = 0.2  # type: ignore[union-attr]
    assert run_one_by_one(e, n=3) == want[:3]
    redis_server.kill()
    assert run_one_by_one(e) == want  # recomputes what storage cannot give
    stats = e.metrics().tier_stats
    assert stats["storage_healthy"] == 0 and stats["storage_unhealthy_events"] >= 1
    redis_server.start()  # restarted, empty
    time.sleep(0.3)  # past the backoff
    assert run_one_by_one(e, seed=2) == reference(seed=2)
    assert e.metrics().tier_stats["storage_healthy"] == 1
    assert e.close()
    assert redis_server.client().dbsize() > 0  # writes resumed


def test_frozen_redis_times_out_and_nothing_hangs(redis_server: RedisServer) -> None:
    want = reference()
    a = redis_engine(redis_server)
    assert run_one_by_one(a) == want and a.close()
    redis_server.pause()  # accepts nothing: only the socket timeouts get calls out
    try:
        b = redis_engine(redis_server)
        assert run_one_by_one(b) == want
        stats = b.metrics().tier_stats
        assert stats["storage_errors"] >= 1 and stats["storage_healthy"] == 0
        b.close(timeout_s=1.0)  # bounded even with writes stuck behind a dead server
    finally:
        redis_server.resume()


def test_corrupt_truncated_and_foreign_redis_values(redis_server: RedisServer) -> None:
    want = reference()
    a = redis_engine(redis_server)
    assert run_one_by_one(a) == want and a.close()
    client = redis_server.client()
    keys = sorted(client.keys("rkv:*"))
    assert keys
    donor = client.get(keys[0])
    assert donor is not None
    for i, k in enumerate(keys):
        v = client.get(k)
        assert v is not None
        if i % 3 == 0:
            client.set(k, v[: len(v) // 3])  # truncated
        elif i % 3 == 1:
            client.set(k, v[:-40] + bytes([v[-40] ^ 1]) + v[-39:])  # one flipped bit
        elif k != keys[0]:
            client.set(k, donor)  # a valid page stored under the wrong key
    bad = {k: client.get(k) for k in keys}
    b = redis_engine(redis_server)
    assert run_one_by_one(b) == want
    assert b.metrics().tier_stats["storage_corrupt"] > 0
    assert b.tiers is not None and b.tiers.worker is not None
    meta = b.tiers.worker.meta
    assert b.close()
    # Probed bad values were deleted, recomputed and written again (valid now); the others
    # are still exactly the bad bytes (never used).
    healed = 0
    for k, v in bad.items():
        now = client.get(k)
        if now != v:
            assert now is not None
            decode_page(k.decode().removeprefix("rkv:"), meta, now)
            healed += 1
    assert healed > 0

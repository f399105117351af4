"""KV events of the lower tiers: pages in host memory (L2) announced with medium "CPU", pages in
storage (L3) with "DISK", decoded by the independent subscriber.

Reference: the tiers' own indexes. After every wave the subscriber's "CPU" table must hold
exactly the L2 index's pages and its "DISK" table exactly the pages this engine knows are in
L3; every announced block's id must be the chained hash of the tokens the subscriber rebuilt
for it (so ids, parents and token ids agree), under its salt.
"""

from __future__ import annotations

import random
from pathlib import Path

from test_kv_events_engine import events_engine, run, sync, workload

from radixkv.cache.tiers import chain_hashes, namespace_seed
from radixkv.engine.events.kv_event_blocks import external_id


def _check_medium(sub: object, medium: str, want: set[bytes], fingerprint: str) -> int:
    got = sub.tier_prefixes(medium)  # type: ignore[attr-defined]
    assert set(got) == {external_id(h) for h in want}, medium
    for block_id, (salt, tokens) in got.items():
        assert len(tokens) % 16 == 0
        chain = chain_hashes(list(tokens), 16, namespace_seed(fingerprint, salt))
        assert external_id(chain[-1]) == block_id, f"{medium} block {block_id}: wrong tokens"
    return len(got)


def test_host_and_storage_pages_are_announced(tmp_path: Path) -> None:
    engine, sub = events_engine(
        page_size=16,
        num_slots=512,
        chunked_prefill_size=48,
        enable_hierarchical_cache=True,
        hicache_size=0.05,  # a few dozen pages: L2 evicts too
        hicache_write_policy="write_back",
        hicache_storage_backend="file",
        hicache_storage_url=str(tmp_path / "l3"),
    )
    tiers = engine.tiers
    assert tiers is not None and tiers.storage is not None and tiers.residency is not None
    rng = random.Random(3)
    seen_cpu = seen_disk = 0
    try:
        for wave in range(5):
            run(engine, workload(rng, 8))
            run(engine, workload(rng, 3), salt=f"tenant-{wave % 2}")
            assert tiers.storage.worker.drain_writes(10)
            tiers.poll(1.0)  # confirmed writes: pages now known in L3
            engine.kv.publish_events()
            sync(engine, sub)
            l2 = set(tiers.index.hashes())
            seen_cpu = max(seen_cpu, _check_medium(sub, "CPU", l2, tiers.fingerprint))
            l3 = set(tiers.storage.known_hashes)
            seen_disk = max(seen_disk, _check_medium(sub, "DISK", l3, tiers.fingerprint))
        assert tiers.index.dropped_pages > 0  # L2 evicted: "CPU" removals were exercised
        assert seen_cpu > 0 and seen_disk > seen_cpu
        assert tiers.residency.unknown == 0
        assert engine.flush_cache()
        sync(engine, sub)
        assert sub.tiers == {} and sub.blocks == {}  # AllBlocksCleared retracts every medium
    finally:
        engine.close()
        sub.close()


def test_larger_blocks_announce_the_device_pool_only() -> None:
    """With blocks of two pages a tier page is not a block: only "GPU" events are sent."""
    engine, sub = events_engine(
        page_size=8, num_slots=512, enable_hierarchical_cache=True, events={"block_size": 16}
    )
    try:
        assert engine.tiers is not None and engine.tiers.residency is None
        run(engine, workload(random.Random(4), 6))
        sync(engine, sub)
        assert sub.blocks and sub.tiers == {}
    finally:
        engine.close()
        sub.close()

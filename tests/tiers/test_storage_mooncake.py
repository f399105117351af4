"""L3 on Mooncake Store: SGLang's configuration surface (environment, JSON file, URL), and on a
real mooncake_master + store service on loopback (skipped with the reason where the Mooncake
wheel is missing): round trip, two engines sharing prefixes, corrupt values, a dead master
(recompute, never a wrong answer) and its return."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from tier_helpers import reference, run_one_by_one, tier_engine

from radixkv.config.sections import CacheConfig
from radixkv.engine.engine import Engine
from radixkv.storage import PageMeta, StorageError, decode_page, encode_page, make_backend
from radixkv.storage.local_services import MooncakeProcs
from radixkv.storage.mooncake_backend import MooncakeBackend, MooncakeConfig, parse_size


def test_config_precedence_and_sizes(tmp_path: Path) -> None:
    assert parse_size("4gb") == 4 << 30 and parse_size("512 MB") == 512 << 20
    assert parse_size(123) == 123 and parse_size("1.5k") == 1536
    with pytest.raises(ValueError):
        parse_size("lots")
    env = {"MOONCAKE_MASTER": "m:1", "MOONCAKE_PROTOCOL": "rdma", "MOONCAKE_DEVICE": "mlx5_0"}
    cfg = MooncakeConfig.load("", env)
    assert (cfg.master_server_address, cfg.protocol, cfg.device_name) == ("m:1", "rdma", "mlx5_0")
    assert cfg.metadata_server == "P2PHANDSHAKE" and cfg.global_segment_size == 4 << 30
    conf = tmp_path / "mc.json"
    conf.write_text(json.dumps({"master_server_address": "f:2", "global_segment_size": "1gb"}))
    cfg = MooncakeConfig.load(None, {**env, "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH": str(conf)})
    assert cfg.master_server_address == "f:2" and cfg.global_segment_size == 1 << 30
    assert cfg.protocol == "rdma"  # the environment fills what the file leaves out
    assert MooncakeConfig.load(str(conf), {}).master_server_address == "f:2"
    assert MooncakeConfig.load("u:3", {**env}).master_server_address == "u:3"
    with pytest.raises(ValueError, match="needs the master"):
        MooncakeConfig.load("", {})
    with pytest.raises(ValueError, match="cannot read"):
        MooncakeConfig.load(str(tmp_path / "missing.json"), {})


def test_config_check_names_the_missing_master(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOONCAKE_MASTER", raising=False)
    monkeypatch.delenv("SGLANG_HICACHE_MOONCAKE_CONFIG_PATH", raising=False)
    sec = CacheConfig(hicache_storage_backend="mooncake")
    assert [f for f, _ in sec.check()] == ["hicache_storage_url"]
    monkeypatch.setenv("MOONCAKE_MASTER", "127.0.0.1:50051")
    assert sec.check() == []


def _config(mc: MooncakeProcs) -> MooncakeConfig:
    return MooncakeConfig(
        master_server_address=mc.master_address,
        metadata_server=mc.metadata_server,
        global_segment_size=0,  # the store service holds the pages: they outlive engines
        local_buffer_size=16 << 20,
        local_hostname="127.0.0.1",
    )


def _json(mc: MooncakeProcs, tmp_path: Path) -> str:
    path = tmp_path / "mooncake.json"
    c = _config(mc)
    path.write_text(json.dumps({k: getattr(c, k) for k in c.__dataclass_fields__}))
    return str(path)


def test_backend_round_trip_miss_and_batches(mooncake: MooncakeProcs, tmp_path: Path) -> None:
    b = make_backend("mooncake", _json(mooncake, tmp_path))
    assert isinstance(b, MooncakeBackend)
    meta = PageMeta("fp", "float32", 2, 4, (2, 4096), 1 << 17)
    keys = [f"{i:032x}" for i in range(200)]
    for i, k in enumerate(keys):
        b.put(k, encode_page(k, meta, bytes([i]) * (1 << 17)))
    got = b.get_many(keys)  # 26 MB: more than the 16 MB buffer, so several batches
    assert [v is not None and decode_page(k, meta, v) == bytes([i]) * (1 << 17)
            for i, (k, v) in enumerate(zip(keys, got, strict=True))] == [True] * 200  # fmt: skip
    assert b.get_many([keys[0], "absent", keys[1]]) == [got[0], None, None]
    b.put(keys[0], b"replaced")  # an upsert: a bad value can be rewritten
    assert b.get(keys[0]) == b"replaced"
    b.delete(keys[1])  # just read: leased, removal refused, not an error
    b.delete("absent")
    b.close()


def mooncake_engine(mc: MooncakeProcs, tmp_path: Path, **kw: object) -> Engine:
    args: dict[str, object] = {
        "hicache_storage_backend": "mooncake",
        "hicache_storage_url": _json(mc, tmp_path),
        "hicache_storage_prefetch_policy": "wait_complete",
    }
    args.update(kw)
    return tier_engine(**args)


class KeyRecorder:
    """Wraps an engine's storage backend and records the keys it writes."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.keys = inner, inner.name, list[str]()

    def put(self, key: str, value: bytes) -> None:
        self.inner.put(key, value)
        self.keys.append(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_two_engines_share_prefixes_and_corrupt_values_recompute(
    mooncake: MooncakeProcs, tmp_path: Path
) -> None:
    want = reference()
    a = mooncake_engine(mooncake, tmp_path)
    assert a.tiers is not None and a.tiers.worker is not None
    rec = a.tiers.worker.backend = KeyRecorder(a.tiers.worker.backend)
    assert run_one_by_one(a) == want
    assert a.close()  # a gone replica: its pages live in the store service
    b = mooncake_engine(mooncake, tmp_path)
    assert run_one_by_one(b) == want
    assert b.metrics().cached_tokens_by_tier["storage"] > 0
    assert b.close()
    # Every stored page replaced by a valid page of another key: each must be refused.
    raw = MooncakeBackend(_config(mooncake))
    assert len(rec.keys) > 2
    donor = raw.get(rec.keys[0])
    assert donor is not None
    for k in rec.keys[1:]:
        raw.delete(k)
        raw.put(k, donor)
    c = mooncake_engine(mooncake, tmp_path)
    assert run_one_by_one(c) == want
    assert c.metrics().tier_stats["storage_corrupt"] > 0
    c.close()
    raw.close()


def test_dead_master_recomputes_then_recovers(mooncake: MooncakeProcs, tmp_path: Path) -> None:
    want, want2 = reference(), reference(seed=2)
    e = mooncake_engine(mooncake, tmp_path, hicache_storage_timeout_s=0.3)
    assert e.tiers is not None and e.tiers.worker is not None
    e.tiers.worker.retry_base_s = e.tiers.worker.retry_max_s = 0.2
    assert run_one_by_one(e, n=3) == want[:3]
    mooncake.kill_master()
    assert run_one_by_one(e) == want  # every storage call fails: recomputed
    stats = e.metrics().tier_stats
    assert stats["storage_healthy"] == 0 and stats["storage_unhealthy_events"] >= 1
    mooncake.restart()  # a fresh, empty deployment on the same ports
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and e.metrics().tier_stats["storage_healthy"] == 0:
        assert run_one_by_one(e, seed=2, n=1) == want2[:1]
        time.sleep(0.3)
    assert e.metrics().tier_stats["storage_healthy"] == 1
    assert run_one_by_one(e, seed=2) == want2
    e.close(timeout_s=2.0)


def test_unreachable_master_at_startup_is_not_fatal() -> None:
    from radixkv.storage.local_services import free_port

    cfg = MooncakeConfig(
        master_server_address=f"127.0.0.1:{free_port()}",
        metadata_server=f"http://127.0.0.1:{free_port()}/metadata",
        global_segment_size=0,
        local_buffer_size=1 << 20,
        local_hostname="127.0.0.1",
    )
    pytest.importorskip("mooncake.store")
    t0 = time.monotonic()
    b = MooncakeBackend(cfg, connect_wait_s=0.5)
    assert time.monotonic() - t0 < 5
    with pytest.raises(StorageError, match="not connected"):
        b.get("k")
    b.close()

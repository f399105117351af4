from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tier_services import mooncake_missing

for _helpers in ("engine", "server"):  # engine_helpers / server_harness, shared with those tests
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / _helpers))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from redis_proc import RedisServer  # noqa: E402

from radixkv.storage.local_services import MooncakeProcs, RedisClusterProcs  # noqa: E402


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server on a free port, killed after the test."""
    srv = RedisServer(tmp_path)
    srv.start()
    try:
        yield srv
    finally:
        if srv.proc is not None:
            srv.resume()
        srv.kill()


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[RedisClusterProcs]:
    """A 3-node Redis Cluster (no replicas) on free loopback ports, stopped after the test."""
    cluster = RedisClusterProcs(tmp_path / "cluster", nodes=3)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def mooncake(tmp_path: Path) -> Iterator[MooncakeProcs]:
    """A mooncake_master (HTTP metadata on) plus a store service, stopped after the test."""
    reason = mooncake_missing()
    if reason is not None:
        pytest.skip(reason)
    procs = MooncakeProcs(tmp_path / "mooncake", segment_bytes=128 << 20)
    try:
        procs.start()
        yield procs
    finally:
        procs.stop()


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

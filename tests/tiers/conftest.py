from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

for _helpers in ("engine", "server"):  # engine_helpers / server_harness, shared with those tests
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / _helpers))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from redis_proc import RedisServer  # noqa: E402


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


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

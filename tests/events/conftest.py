from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

for _helpers in ("engine", "server"):  # engine_helpers / engine_toy / test_cli, shared
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / _helpers))
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    # The toy model's ops are tiny: intra-op threads only add contention (20x slower on a busy
    # 2-core machine). Restored afterwards so other test directories are unaffected.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

_here = Path(__file__).resolve().parent
sys.path.insert(0, str(_here.parent / "events"))  # kv_subscriber (decodes the wire format alone)
sys.path.insert(0, str(_here))  # cluster_harness


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir: Callable[..., Path]) -> Path:
    return tiny_model_dir("llama")

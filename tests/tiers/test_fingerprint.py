"""The model fingerprint that namespaces every L3 key: stable across loads and processes (so a
restarted server finds its pages), different for other weights, configs or KV dtypes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from radixkv.engine.tiers.tier_setup import model_fingerprint
from radixkv.model import load_model

_SNIPPET = (
    "import sys, torch; from radixkv.model import load_model; "
    "from radixkv.engine.tiers.tier_setup import model_fingerprint; "
    "print(model_fingerprint(load_model(sys.argv[1], 'cpu', torch.float32), torch.float32))"
)


@pytest.mark.slow
def test_fingerprint_stable_across_processes_and_distinct(
    tiny_model_dir: Callable[..., Path],
) -> None:
    path = tiny_model_dir("llama")
    fp = model_fingerprint(load_model(str(path), "cpu", torch.float32), torch.float32)
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    out = subprocess.run(
        [sys.executable, "-c", _SNIPPET, str(path)], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == fp
    assert model_fingerprint(load_model(str(path), "cpu", torch.float32), torch.bfloat16) != fp
    other = tiny_model_dir("llama", num_hidden_layers=3)
    assert model_fingerprint(load_model(str(other), "cpu", torch.float32), torch.float32) != fp
    lm = load_model(str(path), "cpu", torch.float32)
    with torch.no_grad():
        next(iter(lm.model.parameters())).view(-1)[0] += 1.0  # one changed weight (sampled)
    assert model_fingerprint(lm, torch.float32) != fp

"""One answer per question on every bfloat16 kernel path the CPU serves, not only the one this
process took: the bfloat16 invariance tests of the engine (batch, chunks, cache hits, tiers,
n > 1), of the native layer stack and of the kernels, re-run in a subprocess forced onto each
other path with $RADIXKV_BF16_GEMM (`radixkv.model.kernels.paths`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from radixkv.model.kernels import cpu_kernels

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[1]
SUITES = [
    TESTS / "engine" / "test_engine_invariance.py",
    TESTS / "model" / "test_native_stack.py",
    TESTS / "model" / "test_model_invariance.py",
]


def _other_paths() -> list[str]:
    module = cpu_kernels()
    if module is None or not module.gemm_bf16_supported():
        return []
    own = module.bf16_gemm()
    return [str(p) for p in module.bf16_gemm_paths() if p != own]


@pytest.mark.parametrize("path", ["fma", "dot", "amx"])
def test_bfloat16_invariance_holds_on_every_path(path: str) -> None:
    if path not in _other_paths():
        pytest.skip(f"'{path}' is this process's own path, or this CPU does not serve it")
    env = {**os.environ, "RADIXKV_BF16_GEMM": path}
    probe = "from radixkv.model.kernels import kernel_paths; print(kernel_paths()['bfloat16_gemm'])"
    taken = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    assert taken.stdout.strip() == path
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *map(str, SUITES)]
    cmd += ["-k", "bf16 or bfloat16 or dtype1"]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=TESTS.parent)
    assert result.returncode == 0, result.stdout[-3000:]
    assert " passed" in result.stdout.splitlines()[-1], result.stdout[-500:]

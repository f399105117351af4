"""The two builds of the C++ kernels (`radixkv.model.kernels.paths.isa`): "avx512" for CPUs with
AVX-512, "avx2" (AVX-512's operations on 256-bit halves, `kernels/avx512_on_avx2.h`) for every
x86-64 CPU from Haswell on. On a CPU that runs both, the avx2 build is forced in a subprocess
($RADIXKV_ISA=avx2): it must pass the kernels' and the engine's invariance and exactness suites,
and give float32 results bit-identical to the avx512 build's (the same code, IEEE operations)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from radixkv.model.kernels import paths

TESTS = Path(__file__).resolve().parents[1]
AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx2", "fma", "f16c"}


def test_the_widest_build_the_cpu_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(paths.ISA_ENV, raising=False)
    assert paths.isa(AVX512) == "avx512"
    assert paths.isa({"avx2", "fma", "f16c", "sse4_2"}) == "avx2"
    assert paths.isa({"avx2", "sse4_2"}) == ""  # no FMA: neither build
    monkeypatch.setenv(paths.ISA_ENV, "avx2")
    assert paths.isa(AVX512) == "avx2"
    monkeypatch.setenv(paths.ISA_ENV, "avx512")
    with pytest.raises(ValueError, match="RADIXKV_ISA=avx512: this CPU runs avx2"):
        paths.isa({"avx2", "fma", "f16c"})


def _needs_both() -> None:
    if os.environ.get(paths.ISA_ENV) or not {"avx512", "avx2"} <= _served():
        pytest.skip("needs a CPU that runs both builds, and no build forced on this process")


def _served() -> set[str]:
    flags = paths.cpu_flags()
    return {name for name, need in paths.ISA_FLAGS.items() if all(f in flags for f in need)}


def _run(cmd: list[str], isa: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, paths.ISA_ENV: isa}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=TESTS.parent)


PROBE = """
import sys, torch
from radixkv.model.kernels import cpu_kernels, kernel_paths
m = cpu_kernels()
assert kernel_paths()["kernels"] == sys.argv[2], kernel_paths()
g = torch.Generator().manual_seed(5)
x = torch.randn(37, 300, generator=g)
w = torch.randn(72, 300, generator=g)
q = torch.randn(90, 6, 64, generator=g)
k, v = torch.randn(2, 130, 2, 64, generator=g)
slots = torch.randperm(130, generator=g)[:90]
one = torch.tensor([90])
out = {
    "gemm": m.gemm(x, m.gemm_pack(w), 72, torch.randn(72, generator=g)),
    "extend": m.extend_attention(q, k, v, slots, torch.tensor([0]), torch.tensor([0]), one,
                                 torch.tensor([0]), 0, 0.125),
    "extend_window": m.extend_attention(q, k, v, slots, torch.tensor([0]), torch.tensor([0]),
                                        one, torch.tensor([0]), 17, 0.125),
    "decode": m.decode_attention(q[-4:].contiguous(), k, v, slots.repeat(4, 1), one.repeat(4),
                                 0, 0.125),
    "rms_norm": m.rms_norm(x, torch.randn(300, generator=g), 1e-5),
    "silu_mul": m.silu_mul(x[:, :200].contiguous()),
    "rms_norm_1p": m.rms_norm_1p(x, torch.randn(300, generator=g), 1e-6),
    "gelu_tanh_mul": m.gelu_tanh_mul(x[:, :200].contiguous()),
}
qkv = torch.randn(40, 2 * 2 * 64 + 4 * 48, generator=g)
state = torch.randn(3, 4, 64, 48, generator=g)
runs = [torch.tensor(c) for c in ([0, 38, 39], [38, 1, 1], [2, 0, 1], [1, 0, 0])]
out["deltanet"] = m.gated_delta_rule(
    qkv[:, :128].reshape(40, 2, 64), qkv[:, 128:256].reshape(40, 2, 64),
    qkv[:, 256:].reshape(40, 4, 48), -torch.rand(40, 4, generator=g),
    torch.rand(40, 4, generator=g), state, *runs, 0.125)
out["deltanet_state"] = state
torch.save(out, sys.argv[1])
"""


def test_float32_gives_the_same_bits_on_both_builds(tmp_path: Path) -> None:
    _needs_both()
    outs = {}
    for isa in ("avx512", "avx2"):
        dest = tmp_path / f"{isa}.pt"
        result = _run([sys.executable, "-c", PROBE, str(dest), isa], isa)
        assert result.returncode == 0, result.stderr[-3000:]
        outs[isa] = torch.load(dest)
    for name, want in outs["avx512"].items():
        assert torch.equal(outs["avx2"][name], want), name


@pytest.mark.slow
def test_the_avx2_build_passes_the_invariance_and_exactness_suites() -> None:
    _needs_both()
    suites = [
        "model/test_model_attention.py",
        "model/test_model_invariance.py",
        "model/test_model_gemm.py",
        "model/test_native_stack.py",
        "engine/test_engine_invariance.py",
        "model/test_model_exactness.py",
        "model/test_deltanet_kernel.py",
    ]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    result = _run(cmd + [str(TESTS / s) for s in suites], "avx2")
    assert result.returncode == 0, result.stdout[-3000:]
    assert " passed" in result.stdout.splitlines()[-1], result.stdout[-500:]

"""bfloat16 attention on AMX tiles (`radixkv/model/kernels/attn_amx.h`).

On a CPU with AMX every bfloat16 extend and decode call runs on the tiles; `RADIXKV_AMX=0` keeps
a process on the AVX-512 BF16 kernels instead. The two give other bits (another summation
order), so these tests check that an AMX host really takes the tiles, that both are accurate,
and that the kernels an AMX host no longer runs by default stay invariant too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from radixkv.model.kernels import cpu_kernels

SCRIPT = """
import sys, torch
from radixkv.model.kernels import cpu_kernels
q, k, v, slots = torch.load(sys.argv[1])
m = cpu_kernels()
n = torch.tensor([q.shape[0]])
out = m.extend_attention(q, k, v, slots, torch.tensor([0]), torch.tensor([0]), n,
                         torch.tensor([0]), 0, 0.125)
dec = m.decode_attention(q[-1:].contiguous(), k, v, slots.view(1, -1), n, 0, 0.125)
torch.save((out, dec), sys.argv[2])
"""


def _amx_host() -> None:
    info = Path("/proc/cpuinfo")
    flags = info.read_text().split() if info.exists() else []
    module = cpu_kernels()
    if module is None or "amx_bf16" not in flags or not module.gemm_bf16_amx():
        pytest.skip("no AMX (amx_bf16) on this CPU, or no kernels")


def _run(env_amx: str, tmp_path: Path, problem: Path) -> tuple[torch.Tensor, torch.Tensor]:
    out = tmp_path / f"out-{env_amx}.pt"
    env = {**os.environ, "RADIXKV_AMX": env_amx}
    subprocess.run([sys.executable, "-c", SCRIPT, str(problem), str(out)], env=env, check=True)
    result: tuple[torch.Tensor, torch.Tensor] = torch.load(out)
    return result


def test_bf16_attention_takes_the_tiles_and_stays_accurate(tmp_path: Path) -> None:
    """The tile path and the AVX-512 BF16 path give other bits for the same problem (so the AMX
    host did take the tiles), each within bf16 rounding of a float32 reference, and each agrees
    with itself between a prefill row and a decode step."""
    _amx_host()
    g = torch.Generator().manual_seed(7)
    length, heads, kv, d = 700, 9, 3, 64
    pool = torch.randn(2, length + 30, kv, d, generator=g).to(torch.bfloat16)
    q = torch.randn(length, heads, d, generator=g).to(torch.bfloat16)
    slots = torch.randperm(length + 30, generator=g)[:length]
    problem = tmp_path / "problem.pt"
    torch.save((q, pool[0], pool[1], slots), problem)
    tiles, tiles_dec = _run("1", tmp_path, problem)
    vector, vector_dec = _run("0", tmp_path, problem)
    assert not torch.equal(tiles, vector)
    assert torch.equal(tiles_dec[0], tiles[-1]) and torch.equal(vector_dec[0], vector[-1])
    rep = heads // kv
    keys = pool[0][slots].float().repeat_interleave(rep, dim=1).transpose(0, 1)
    vals = pool[1][slots].float().repeat_interleave(rep, dim=1).transpose(0, 1)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float().transpose(0, 1), keys, vals, is_causal=True, scale=0.125
    ).transpose(0, 1)
    for out in (tiles, vector):
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_the_avx512_bf16_kernels_stay_invariant_on_an_amx_host() -> None:
    """The kernel-level invariance tests in bfloat16 with the tiles turned off."""
    _amx_host()
    here = Path(__file__).with_name("test_model_invariance.py")
    env = {**os.environ, "RADIXKV_AMX": "0"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(here)]
    cmd += ["-k", "dtype1"]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:]

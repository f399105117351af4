"""The Triton paged-attention kernels (radixkv.model.triton): on CPU tensors under Triton's
interpreter (tests/conftest.py sets TRITON_INTERPRET=1 where no GPU is visible), compiled on CUDA
tensors where one is. The problems and checks are radixkv.model.triton.checks', the ones
scripts/gpu_check.py runs on a GPU.

- every case of a ragged batch (decodes and extends, cached prefixes, windows, GQA groups 1-4,
  head dims 64 / 80 / 128, float32 / float16 / bfloat16, slot and page tables) within the
  dtype's tolerance of a float64 softmax, and the same bits through one part and split-K;
- bit invariance (torch.equal): a request alone vs in a batch, a prompt whole vs in chunks,
  extend rows vs the decode kernel at their positions, parts and page tables;
- the launchers refuse bad input with a ValueError that says what is wrong;
- (slow) the kernels compile for Hopper with Triton's own ptxas, no GPU needed.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("triton")

from radixkv.model.triton.checks import CASES, INVARIANCE, check_case, invariance_pairs
from radixkv.model.triton.interpreter import interpreting
from radixkv.model.triton.paged_attention import (
    BLOCK_M,
    decode_attention,
    decode_parts,
    extend_attention,
    paged_attention,
)
from radixkv.model.triton.reference import problem

SRC = Path(__file__).resolve().parents[2] / "src"
DEVICE = "cpu" if interpreting() else ("cuda" if torch.cuda.is_available() else None)
pytestmark = pytest.mark.skipif(
    DEVICE is None, reason="Triton imported without TRITON_INTERPRET=1 and no CUDA device"
)

F32, BF16 = torch.float32, torch.bfloat16
# One run per kind by default (both dtypes, with and without a window between them); the rest
# of the grid is slow (the interpreter runs a 64-row tile in milliseconds, not microseconds).
FAST = [("batch", BF16, 37), ("chunks", F32, None), ("decode", BF16, 37), ("parts", F32, None)]
GRID = [
    pytest.param(
        *combo,
        marks=() if combo in FAST else pytest.mark.slow,
        id=f"{combo[0]}-{str(combo[1]).removeprefix('torch.')}-window{combo[2]}",
    )
    for combo in itertools.product(INVARIANCE, (F32, BF16), (None, 37))
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_the_float64_reference(case: Any) -> None:
    result = check_case(case, DEVICE)
    assert result["within_tolerance"], result
    assert result["parts_equal"], result


@pytest.mark.parametrize(("kind", "dtype", "window"), GRID)
def test_bit_invariance(kind: str, dtype: torch.dtype, window: int | None) -> None:
    for label, a, b in invariance_pairs(kind, dtype, DEVICE, window):
        assert a.shape == b.shape, label
        diff = (a.float() - b.float()).abs().max().item()
        assert torch.equal(a, b), f"{label}: max difference {diff}"


def test_decode_parts_cover_every_split() -> None:
    assert decode_parts(1) == decode_parts(512) == 1
    assert decode_parts(513) == 2 and decode_parts(4096) == 8
    assert decode_parts(100_000, window=512) == 2  # a window of 512 keys touches two splits
    assert decode_parts(100_000, window=513) == 2 and decode_parts(100_000, window=514) == 3


def test_an_empty_batch_returns_an_empty_output() -> None:
    p = problem([5], [5], heads=2, kv=1, dim=64, dtype=F32, device=DEVICE or "cpu")
    q = p.q[:0]
    out = extend_attention(q, p.k, p.v, p.table[:0], p.seq_lens[:0], p.q_start[:1], scale=1.0)
    assert out.shape == (0, 2, 64)


def _cut(name: str, dim: int) -> Callable[[dict[str, Any]], torch.Tensor]:
    return lambda a: a[name][..., :dim]


def _bad_inputs() -> list[tuple[str, Callable[[dict[str, Any]], None], str]]:
    """(id, mutation of good launcher arguments, expected message)."""

    def put(**kw: Any) -> Callable[[dict[str, Any]], None]:
        return lambda a: a.update({k: f(a) for k, f in kw.items()})

    return [
        ("q-2d", put(q=lambda a: a["q"][:, 0]), "q must be"),
        ("kv-shapes", put(v_cache=lambda a: a["v_cache"][:-1]), "differ in shape"),
        ("dtype-mix", put(k_cache=lambda a: a["k_cache"].half()), "share one dtype"),
        ("int-q", put(q=lambda a: a["q"].long()), "share one dtype"),
        ("head-dim-72", put(**{n: _cut(n, 72) for n in ("q", "k_cache", "v_cache")}), "of 16"),
        ("head-dim-mismatch", put(q=lambda a: a["q"][..., :64].contiguous()), "head dim 64"),
        ("heads", put(q=lambda a: a["q"][:, :3]), "multiple of KV heads"),
        ("group", put(q=lambda a: a["q"].repeat(1, BLOCK_M + 1, 1)), f"at most {BLOCK_M}"),
        ("strided", put(q=lambda a: a["q"].mT.contiguous().mT), "contiguous"),
        ("table-float", put(table=lambda a: a["table"].float()), "table must be"),
        ("seq-lens", put(seq_lens=lambda a: a["seq_lens"][:1]), "seq_lens must be"),
        ("q-start", put(q_start=lambda a: a["q_start"][:-1]), "q_start must be"),
        ("q-start-end", put(q_start=lambda a: a["q_start"] - 1), "run from 0 to T"),
        ("too-many-new", put(seq_lens=lambda a: a["seq_lens"] - 30), "new tokens"),
        ("narrow-table", put(table=lambda a: a["table"][:, :10]), "columns"),
        ("window-0", put(window=lambda a: 0), "window"),
        ("out-shape", put(out=lambda a: a["q"][:-1].clone()), "out must be"),
    ]


@pytest.mark.parametrize(("mutate", "message"), [b[1:] for b in _bad_inputs()],
                         ids=[b[0] for b in _bad_inputs()])  # fmt: skip
def test_launchers_refuse_bad_input(mutate: Callable[[dict[str, Any]], None], message: str) -> None:
    p = problem([40, 8], [40, 1], heads=4, kv=2, dim=128, dtype=F32)
    args: dict[str, Any] = {"q": p.q, "k_cache": p.k, "v_cache": p.v, "table": p.table}
    args |= {"seq_lens": p.seq_lens, "q_start": p.q_start, "window": None}
    mutate(args)
    with pytest.raises(ValueError, match=message):
        paged_attention(**args, scale=1.0)


def test_decode_refuses_a_multi_token_q_start() -> None:
    p = problem([9, 8], [1, 1], heads=2, kv=1, dim=64, dtype=F32)
    with pytest.raises(ValueError, match="request 1 has 0 new tokens"):
        decode_attention(p.q, p.k, p.v, p.table, p.seq_lens, scale=1.0, max_seq_len=9,
                         q_start=torch.tensor([0, 2, 2]))  # fmt: skip


def _compiled_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    return env


@pytest.mark.slow
def test_kernels_compile_for_hopper() -> None:
    """Built for sm_90 (H100 / H200) by Triton's NVIDIA backend and bundled ptxas, no GPU."""
    cmd = [sys.executable, "-m", "radixkv.model.triton.aot", "--arch", "90"]
    done = subprocess.run(cmd, env=_compiled_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["partials"]["warp_group_mma"], result
    # bfloat16: no FMA anywhere, so the fold rounds its products and sums apart in both kernels.
    assert not result["partials"]["fma"] and not result["combine"]["fma"], result


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: CPU tensors are refused")
def test_compiled_kernels_refuse_cpu_tensors() -> None:
    code = (
        "import torch\n"
        "from radixkv.model.triton.paged_attention import extend_attention\n"
        "q = torch.zeros(1, 1, 16)\n"
        "try:\n"
        "    extend_attention(q, q, q, torch.zeros(1, 1, dtype=torch.long), torch.ones(1, "
        "dtype=torch.long), torch.tensor([0, 1]), scale=1.0)\n"
        "except ValueError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=_compiled_env(), capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert "need Triton's interpreter" in done.stdout, done.stdout + done.stderr[-2000:]

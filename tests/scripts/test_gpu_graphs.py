"""The decode-graph stage of the device check (scripts/gpu_graphs.py) as a dry run on the CPU:
a small Llama shape through the Triton kernels under the interpreter and the recording capturer,
so a bug in the code only a GPU session runs in full shows here; and the guard every stage of
scripts/gpu_check.py runs in."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from radixkv.model.config import LlamaConfig
from scripts.gpu_check import _stage
from scripts.gpu_graphs import ONE_B, graphs_check, weight_bytes


def test_the_graph_stage_runs_as_a_dry_run_on_cpu() -> None:
    pytest.importorskip("triton")
    from radixkv.model.triton.interpreter import interpreting

    if not interpreting():
        pytest.skip("Triton is not interpreted in this process")
    r = graphs_check("cpu")
    assert r["ok"], r
    assert [row["requests"] for row in r["exactness"]] == [1, 2, 3, 4]
    assert all(row["replayed"] and row["equal_eager"] for row in r["exactness"])
    assert [row["requests"] for row in r["timings"]] == [1, 2, 4]
    assert r["buckets"] == [1, 2, 4] and r["fallbacks"] == {}


def test_the_weight_read_floor_counts_every_projection_and_the_head_once() -> None:
    cfg = LlamaConfig.from_dict({"architectures": ["LlamaForCausalLM"], **ONE_B})
    model = SimpleNamespace(config=cfg, dtype=torch.bfloat16)
    # 16 layers x (q, k, v, o: 10,485,760 + MLP: 50,331,648) + head 49,152 x 2,048 = 2**30
    assert weight_bytes(model) == 2 * 2**30


def test_a_stage_that_raises_prints_fail_and_the_run_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def broken() -> dict:
        raise RuntimeError("CUDA error: an illegal memory access")

    r = _stage("graphs", broken)
    assert not r["ok"] and "illegal memory access" in r["error"]
    assert "FAIL graphs" in capsys.readouterr().out
    assert _stage("fine", lambda: {"ok": True})["ok"]

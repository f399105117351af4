"""The serving stages of the device check (scripts/gpu_serving.py) and its stage runner
(scripts/gpu_check.Run), on CPU with a tiny checkpoint: the code a GPU session runs in full is
exercised here, so a bug in it shows before device time is spent."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from scripts.gpu_check import Run
from scripts.gpu_serving import prefix_ttft


def test_prefix_ttft_hits_the_whole_prefix(tiny_model_dir: Callable[..., Path]) -> None:
    path = str(tiny_model_dir("llama"))
    r = prefix_ttft(path, "cpu", "float32", reps=2, prefix=48, suffix=5)
    assert r["ok"], r
    assert r["cached_tokens"] == [48, 48]  # page size 1: every prefix token is a hit
    assert len(r["cold_ms"]) == len(r["warm_ms"]) == 2
    assert r["cut"] == r["cold_median_ms"] / r["warm_median_ms"]


def test_a_stage_past_the_deadline_is_skipped_and_every_stage_is_saved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    run = Run(str(out), deadline_s=100.0)
    ran = []
    run.stage("a", "first", lambda: ran.append(1) or {"ok": True, "x": 1}, est_s=1)
    assert json.loads(out.read_text())["a"]["x"] == 1  # saved before the next stage starts
    run.stage("exactness", "long", lambda: ran.append(2) or {"ok": True}, est_s=1000)
    run.stage("exactness", "broken", lambda: {"ok": False}, est_s=1)
    assert ran == [1]
    saved = json.loads(out.read_text())
    assert "deadline" in saved["exactness"][0]["skipped"]
    assert run.failed() == ["broken"]
    assert "long: skipped: deadline" in capsys.readouterr().out

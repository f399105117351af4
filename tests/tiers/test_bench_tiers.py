"""`radixkv bench tiers` runs end to end (toy model) and reports per-round rows for every mode,
hits by tier that add up, and the restart TTFT with and without L3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_toy import ToyLM

from radixkv.cli import main


def test_bench_tiers_small(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("radixkv.engine.setup.load", lambda *a, **k: ToyLM())
    out = tmp_path / "tiers.json"
    argv = ["bench", "tiers", "--rounds", "3", "--turn-len", "40"]
    argv += ["--output-len", "4", "--prefix-len", "120", "--device", "cpu", "--page-size", "4"]
    argv += ["--clients", "3", "--concurrency", "2"]
    assert main([*argv, "--json", str(out), "--plot", str(tmp_path / "tiers.png")]) == 0
    assert (tmp_path / "tiers.png").stat().st_size > 0
    res = json.loads(out.read_text())
    assert set(res["modes"]) == {"L1", "L1+L2", "L1+L2+L3"}
    for mode in res["modes"].values():
        assert [r["round"] for r in mode["rounds"]] == [1, 2, 3]
        for r in mode["rounds"]:
            hits = sum(r["hits_by_tier"].values())
            assert hits == round(r["token_hit_rate"] * r["prompt_tokens"])
    assert res["modes"]["L1"]["tier_stats"] == {}
    assert res["restart"]["with_l3"]["cached_tokens"] == 120
    assert res["restart"]["without_l3"]["cached_tokens"] == 0
    assert "restart, 120-token prefix" in capsys.readouterr().out

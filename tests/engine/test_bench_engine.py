from __future__ import annotations

import argparse

import pytest
from engine_toy import ToyLM

from radixkv.bench.engine import prefix_target, register, run_workloads
from radixkv.engine.args import engine_config_from_args


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["engine", *argv])


def test_bench_engine_rows_and_hit_rates(capsys: pytest.CaptureFixture[str]) -> None:
    args = _args(
        [
            "--device", "cpu", "--num-slots", "2048", "--chunked-prefill-size", "64",
            "--groups", "2", "--prompts-per-group", "3", "--system-len", "40",
            "--question-len", "6", "--output-len", "3", "--conversations", "2", "--turns", "2",
            "--root-len", "30", "--branches", "2", "--depth", "1", "--concurrency", "2",
        ]
    )  # fmt: skip
    rows = run_workloads(ToyLM(), engine_config_from_args(args), args)
    assert len(rows) == 9
    by = {(r["workload"], r["cache"]): r for r in rows}
    for wl in ("shared-prefix", "multi-turn", "tree-of-thought"):
        off, radix, bh = by[(wl, "off")], by[(wl, "radix")], by[(wl, "blockhash")]
        assert off["token_hit_rate"] == 0.0
        assert 0.0 < radix["token_hit_rate"] <= radix["ideal_hit_rate"] + 1e-9
        assert bh["token_hit_rate"] == pytest.approx(radix["token_hit_rate"])
        for r in (off, radix, bh):
            assert r["output_tokens"] == r["requests"] * 3
            assert r["ttft_p50_s"] <= r["ttft_p99_s"]
    assert "shared-prefix" in capsys.readouterr().out


def test_prefix_target_hits_the_whole_prefix() -> None:
    args = _args(["--device", "cpu", "--num-slots", "512"])
    t = prefix_target(ToyLM(), engine_config_from_args(args), prefix=96, suffix=8, repeats=2)
    assert t["hit_cached_tokens"] == [96, 96]
    assert t["ratio_median"] > 0 and len(t["hit_ttft_s"]) == 2

"""`bench compare --rounds`: the rotated run order (checked against when fake servers were actually
hit), the aggregation of a column over its rounds, and how the report shows both."""

from __future__ import annotations

import argparse
import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from fake_openai_server import FakeServer

from radixkv.bench.serving import compare
from radixkv.bench.serving.client import RequestResult
from radixkv.bench.serving.metrics import summarize
from radixkv.bench.serving.rounds import merge_rounds, round_orders
from radixkv.bench.serving.server_proc import CONFIG_HELP, CONFIGS
from scripts.report import render


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    compare.register(parser.add_subparsers())
    return parser.parse_args(["compare", *argv])


def test_round_orders_rotate_by_one_each_round() -> None:
    assert round_orders(["a", "b", "c"], 4) == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"],
    ]  # fmt: skip
    assert round_orders(["a", "b"], 1) == [["a", "b"]]
    assert round_orders([], 2) == [[], []]
    with pytest.raises(ValueError):
        round_orders(["a"], 0)


def _collapse(seq: list[str]) -> list[str]:
    out: list[str] = []
    for x in seq:
        if not out or out[-1] != x:
            out.append(x)
    return out


def test_compare_rounds_run_in_rotated_order_and_aggregate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = ["a", "b", "c"]
    with ExitStack() as stack:
        fakes = {n: stack.enter_context(FakeServer(first_delay=0.02)) for n in names}
        args = _parse([
            "--model", str(tmp_path), "--configs", "", "--rounds", "2",
            *(x for n in names for x in ("--extra", f"{n}={fakes[n].url}")),
            "--workload", "multi-turn", "--num-conversations", "1", "--num-turns", "2",
            "--question-len", "4", "--output-len", "2", "--warmup", "0", "--no-progress",
            "--out", str(tmp_path / "cmp"),
        ])  # fmt: skip
        assert args.func(args) == 0
    # when each server was actually hit: a, b, c in round 1, then b, c, a in round 2
    hits = sorted((e["arrive"], n) for n, f in fakes.items() for e in f.log)
    assert _collapse([n for _, n in hits]) == ["a", "b", "c", "b", "c", "a"]
    for fake in fakes.values():  # the prefix cache flushed before each of its 2 measured runs
        assert fake.flushes == 2 and len(fake.log) == 4
    result = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert result["rounds"] == 2 and result["order"] == [["a", "b", "c"], ["b", "c", "a"]]
    run = result["runs"]["a"]
    assert [(r["round"], r["position"]) for r in run["rounds"]] == [(0, 0), (1, 2)]
    assert run["summary"]["completed"] == 4 and run["summary"]["output_tokens"] == 8
    assert sorted(r["round"] for r in run["requests"]) == [0, 0, 1, 1]
    assert run["summary"]["wall_s"] == pytest.approx(
        sum(r["summary"]["wall_s"] for r in run["rounds"])
    )
    assert run["flushed_after_warmup"] is True
    assert all(isinstance(r["loadavg"], str) for r in run["rounds"])  # load when each run began
    printed = capsys.readouterr().out
    assert "round 1: a → b → c" in printed and "round 2: b → c → a" in printed
    assert "- round 2: b → c → a" in (tmp_path / "cmp" / "compare.md").read_text()


def test_columns_reject_unknown_and_duplicate_names(tmp_path: Path) -> None:
    bad = (
        ["--configs", "radix,nope"],
        ["--configs", "radix,radix"],
        ["--configs", "radix", "--extra", "radix=http://x"],
        ["--extra", "novalue"],
    )
    for argv in bad:
        with pytest.raises(SystemExit):
            compare._columns(_parse(argv))
    cols = compare._columns(_parse(["--configs", "off,radix-p16", "--extra", "v=http://h:1"]))
    assert cols == {"off": None, "radix-p16": None, "v": "http://h:1"}


def test_page_sizes_are_explicit_and_matched() -> None:
    assert CONFIGS["radix-p16"][-2:] == CONFIGS["blockhash"][-2:] == ("--page-size", "16")
    assert CONFIGS["radix"][-2:] == ("--page-size", "1")
    assert "16 tokens" in CONFIG_HELP["blockhash"] and "16 tokens" in CONFIG_HELP["radix-p16"]
    assert "radix-p16" in compare.DEFAULT_CONFIGS


def _round(
    r: int, pos: int, n: int, prompt: int, cached: int, ttft: float, wall: float
) -> dict[str, Any]:
    results = [
        RequestResult(i, "g", True, ttft_s=ttft, e2e_s=ttft + 0.1, tpot_s=0.01,
                      prompt_tokens=prompt, cached_tokens=cached, output_tokens=10,
                      usage_reported=True)
        for i in range(n)
    ]  # fmt: skip
    return {
        "round": r, "position": pos, "base_url": f"http://h:{r}", "model": "m",
        "flushed_after_warmup": True, "load": {"concurrency": 2, "warmup": 1},
        "summary": summarize(results, wall, 0.6, not_sent=r),
        "requests": [x.to_dict() for x in results],
        "server": {"kind": "radixkv", "flags": ["--x"], "startup_s": 1.0 + r},
    }  # fmt: skip


def test_merge_rounds_pools_requests_and_sums_tokens() -> None:
    merged = merge_rounds([_round(0, 0, 2, 100, 0, 1.0, 2.0), _round(1, 1, 3, 200, 150, 0.1, 1.0)])
    s = merged["summary"]
    assert (s["completed"], s["errors"], s["not_sent"]) == (5, 0, 1)
    assert (s["prompt_tokens"], s["cached_tokens"], s["output_tokens"]) == (800, 450, 50)
    # Σcached ÷ Σprompt = 450/800, not the mean of the per-round rates (0 and 0.75)
    assert s["token_hit_rate"] == pytest.approx(0.5625)
    assert s["wall_s"] == pytest.approx(3.0) and s["output_tok_per_s"] == pytest.approx(50 / 3)
    assert s["ttft_s"]["mean"] == pytest.approx((2 * 1.0 + 3 * 0.1) / 5)
    assert s["ttft_s"]["p50"] == pytest.approx(0.1) and s["ideal_hit_rate"] == 0.6
    assert [r["round"] for r in merged["requests"]] == [0, 0, 1, 1, 1]
    assert [(r["round"], r["position"], r["base_url"]) for r in merged["rounds"]] == [
        (0, 0, "http://h:0"), (1, 1, "http://h:1"),
    ]  # fmt: skip
    assert merged["rounds"][1]["summary"]["token_hit_rate"] == pytest.approx(0.75)
    assert merged["server"]["startup_s"] == [1.0, 2.0] and "round" not in merged
    assert merged["load"] == {"concurrency": 2, "warmup": 1}
    one = merge_rounds([_round(0, 0, 2, 100, 40, 0.5, 1.0)])  # one round: same numbers as its run
    assert one["summary"] == _round(0, 0, 2, 100, 40, 0.5, 1.0)["summary"]


def test_report_shows_order_and_per_round_ttft(tmp_path: Path) -> None:
    runs = {
        "off": merge_rounds([_round(0, 0, 2, 100, 0, 1.0, 2.0), _round(1, 1, 2, 100, 0, 0.8, 2.0)]),
        "blockhash": merge_rounds(
            [_round(0, 1, 2, 100, 50, 0.3, 1.0), _round(1, 0, 2, 100, 50, 0.2, 1.0)]
        ),
    }
    runs["blockhash"]["server"]["flags"] = list(CONFIGS["blockhash"])
    result = {
        "created": "2026-01-01T00:00:00Z", "command": "radixkv bench compare --rounds 2",
        "model": "default", "machine": compare.machine_info(), "rounds": 2,
        "order": [["off", "blockhash"], ["blockhash", "off"]], "runs": runs,
        "workload": {"name": "shared-prefix", "seed": 0, "params": {}, "num_requests": 2,
                     "prompt_tokens": 200, "max_output_tokens": 20, "ideal_hit_rate": 0.6},
    }  # fmt: skip
    text = render([result], tmp_path / "b.md", "python scripts/report.py --from x")
    assert "Run order: 2 rounds" in text
    assert "- round 1: off → blockhash" in text and "- round 2: blockhash → off" in text
    row = next(line for line in text.splitlines() if line.startswith("| blockhash "))
    assert "300.0 (#2" in row and "200.0 (#1" in row
    assert "page (block) size 16 tokens" in text and "--page-size 16" in text
    assert "(before every measured run)" in text
    assert "mean TTFT 0.90 s → 0.25 s" in text  # pooled over both rounds

"""`bench compare` / `scripts/report.py`: the table and its ratios, the outputs, and (slow) a short
end-to-end compare against our real server on a tiny model."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest
from fake_openai_server import FakeServer

from radixkv.bench.serving import compare
from radixkv.bench.serving.client import RequestResult
from radixkv.bench.serving.compare_table import markdown_table, table_rows
from radixkv.bench.serving.metrics import summarize
from scripts import report
from scripts.report import render

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fake_summary(ttft: float, n: int, cached: int, wall: float) -> tuple[dict[str, Any], list]:
    results = [
        RequestResult(i, "g", True, ttft_s=ttft, e2e_s=ttft + 0.1, tpot_s=0.01, prompt_tokens=100,
                      cached_tokens=cached, output_tokens=11, usage_reported=True)
        for i in range(n)
    ]  # fmt: skip
    return summarize(results, wall, ideal_hit_rate=0.75), [r.to_dict() for r in results]


def cells(rows: list[list[str]], label: str) -> list[str]:
    return next(r[1:] for r in rows if r[0] == label)


def test_table_ratios_against_off() -> None:
    off, _ = fake_summary(0.200, 4, 0, wall=2.0)
    radix, _ = fake_summary(0.050, 4, 75, wall=1.0)
    rows = table_rows({"off": off, "radix": radix})
    assert rows[0] == ["metric", "off", "radix"]
    assert cells(rows, "TTFT mean (ms)") == ["200.0", "50.0"]
    assert cells(rows, "TTFT mean ÷ off") == ["1.00×", "0.25×"]
    assert cells(rows, "output tokens/s") == ["22.0", "44.0"]
    assert cells(rows, "output tokens/s ÷ off") == ["1.00×", "2.00×"]
    assert cells(rows, "effective input tokens/s ÷ off") == ["1.00×", "2.00×"]
    assert cells(rows, "token hit rate (server)") == ["0.0%", "75.0%"]
    assert cells(rows, "ideal hit rate") == ["75.0%", "75.0%"]
    # without an `off` column there is nothing to divide by: no ratio rows
    assert not any("÷" in r[0] for r in table_rows({"radix": radix}))
    lines = markdown_table({"off": off, "radix": radix}).splitlines()
    assert len({len(x) for x in lines}) == 1 and lines[1].startswith("|---")


def test_outputs_and_report(tmp_path: Path) -> None:
    runs = {}
    for name, ttft, cached in (("off", 0.2, 0), ("radix", 0.05, 75)):
        summary, reqs = fake_summary(ttft, 5, cached, wall=1.0)
        flags = list(compare.CONFIGS[name])
        runs[name] = {"summary": summary, "requests": reqs, "model": "m",
                      "server": {"kind": "radixkv", "flags": flags},
                      "flushed_after_warmup": True,
                      "load": {"request_rate": None, "concurrency": 3, "warmup": 2}}  # fmt: skip
    result = {
        "created": "2026-01-01T00:00:00Z",
        "command": "radixkv bench compare --model default --workload shared-prefix",
        "model": "default",
        "machine": compare.machine_info(),
        "workload": {
            "name": "shared-prefix",
            "seed": 0,
            "params": {"num_groups": 2},
            "num_requests": 5,
            "prompt_tokens": 500,
            "max_output_tokens": 55,
            "ideal_hit_rate": 0.75,
        },
        "runs": runs,
    }
    files = compare.write_outputs(result, tmp_path / "cmp")
    assert Path(files["ttft_cdf"]).read_bytes()[:8] == PNG_MAGIC
    saved = json.loads(Path(files["json"]).read_text())
    assert saved["plots"]["ttft_cdf"] == files["ttft_cdf"]
    md = tmp_path / "docs" / "benchmarks.md"
    text = render([saved], md, "python scripts/report.py --from x.json", ["peer: started by hand"])
    assert md.read_text() == text
    assert "radixkv bench compare --model default --workload shared-prefix" in text
    assert "python scripts/report.py --from x.json" in text and "- peer: started by hand" in text
    assert "| TTFT mean ÷ off" in text and "0.25×" in text
    assert "**radix** vs cache off: mean TTFT 0.20 s → 0.05 s (0.25×)" in text
    assert "output throughput 1.00×, token hit rate 75.0% (ideal 75.0%)" in text
    assert "at most 3 in flight; 2 unrelated warm-up requests first, then the server" in text
    assert "--disable-radix-cache" in text and str(result["machine"]["cpu"]) in text
    img = md.parent / "benchmarks" / "0-shared-prefix-ttft_cdf.png"
    assert "(benchmarks/0-shared-prefix-ttft_cdf.png)" in text and img.read_bytes()[:8] == PNG_MAGIC


def _parse(module: Any, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.register(parser.add_subparsers())
    return parser.parse_args(argv)


def test_compare_runs_an_extra_openai_server(tmp_path: Path) -> None:
    with FakeServer() as fake:
        args = _parse(compare, [
            "compare", "--model", str(tmp_path), "--configs", "", "--extra", f"fake={fake.url}",
            "--workload", "multi-turn", "--num-conversations", "2", "--num-turns", "2",
            "--question-len", "4", "--output-len", "2", "--warmup", "0", "--no-progress",
            "--out", str(tmp_path / "cmp"),
        ])  # fmt: skip
        assert args.func(args) == 0
        # closed loop: a conversation's second turn (same leading tokens) arrived only after
        # its first turn had finished
        assert len(fake.log) == 4
        by_conv: dict[tuple[int, ...], list[dict[str, Any]]] = {}
        for e in fake.log:
            by_conv.setdefault(tuple(e["key"]), []).append(e)
        assert sorted(len(v) for v in by_conv.values()) == [2, 2]
        assert all(second["arrive"] >= first["done"] for first, second in by_conv.values())
    result = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    run = result["runs"]["fake"]
    assert run["server"] == {"kind": "extra", "url": fake.url, "version": "fake-1.0"}
    assert run["model"] == "fake-model"
    assert run["summary"]["completed"] == 4 and run["summary"]["token_hit_rate"] == 0.5
    assert re.search(r"\|\s*fake\s*\|", (tmp_path / "cmp" / "compare.md").read_text())


@pytest.mark.slow
def test_compare_end_to_end_against_our_server(tiny_model_dir: Any, tmp_path: Path) -> None:
    if importlib.util.find_spec("radixkv.server.app") is None:
        pytest.skip("the server module (radixkv.server.app) has not landed")
    model = tiny_model_dir("llama")
    out = tmp_path / "cmp"
    args = _parse(compare, [
        "compare", "--model", str(model), "--configs", "off,radix", "--workload", "shared-prefix",
        "--num-groups", "2", "--prompts-per-group", "3", "--system-len", "48",
        "--question-len", "8", "--output-len", "3", "--warmup", "1", "--no-progress",
        "--concurrency", "2", "--out", str(out), "--startup-timeout", "120",
    ])  # fmt: skip
    assert args.func(args) == 0
    result = json.loads((out / "compare.json").read_text())
    ideal = result["workload"]["ideal_hit_rate"]
    assert ideal == pytest.approx(2 * 2 * 48 / (6 * 56), abs=0.02)
    off, radix = result["runs"]["off"]["summary"], result["runs"]["radix"]["summary"]
    for s in (off, radix):
        assert (s["completed"], s["errors"]) == (6, 0)
        assert s["output_tokens"] == 6 * 3 and s["ttft_s"]["p50"] > 0
    assert off["token_hit_rate"] == 0.0
    # the radix server reuses the shared system prompts (a full hit still recomputes 1 token)
    assert 0.5 * ideal < radix["token_hit_rate"] <= ideal + 1e-9
    assert (out / "ttft_cdf.png").read_bytes()[:8] == PNG_MAGIC
    md = tmp_path / "benchmarks.md"
    assert report.main(["--from", str(out / "compare.json"), "--out", str(md)]) == 0
    text = md.read_text()
    assert "| TTFT mean ÷ off" in text and re.search(r"\|\s*off\s*\|\s*radix\s*\|", text)
    assert "![ttft_cdf](benchmarks/0-shared-prefix-ttft_cdf.png)" in text

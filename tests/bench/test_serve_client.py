"""The serving client against a fake streaming server on 127.0.0.1 with known injected delays."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai_server import ERROR_MAX_TOKENS, FIRST_DELAY, TOKEN_DELAY, FakeServer

from radixkv.bench.inputs.workloads import BenchRequest
from radixkv.bench.serving import serve
from radixkv.bench.serving.client import ClientOptions, run_requests
from radixkv.bench.serving.metrics import format_summary, summarize


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as s:
        yield s


def req(
    i: int, n_prompt: int, max_tokens: int, parent: int | None = None, **kw: Any
) -> BenchRequest:
    return BenchRequest(i, [100 + i] * n_prompt, max_tokens, f"g{i}", parent=parent, **kw)


def test_ttft_tpot_e2e_and_usage(server: FakeServer) -> None:
    reqs = [req(0, 10, 6), req(1, 7, 6), req(2, 4, ERROR_MAX_TOKENS), req(3, 9, 1)]
    run = asyncio.run(run_requests(reqs, ClientOptions(server.url, "m", concurrency=4)))
    ok = {r.index: r for r in run.results if r.ok}
    assert sorted(ok) == [0, 1, 3]
    bad = [r for r in run.results if not r.ok]
    assert len(bad) == 1 and bad[0].error is not None and "500" in bad[0].error
    for i in (0, 1):
        r = ok[i]
        assert r.ttft_s is not None and r.tpot_s is not None and r.e2e_s is not None
        assert FIRST_DELAY <= r.ttft_s < FIRST_DELAY + 0.15
        assert TOKEN_DELAY * 0.9 <= r.tpot_s < TOKEN_DELAY + 0.025
        assert FIRST_DELAY + 5 * TOKEN_DELAY <= r.e2e_s < FIRST_DELAY + 5 * TOKEN_DELAY + 0.25
        assert r.output_tokens == 6 and r.usage_reported
    assert ok[3].tpot_s is None and ok[3].output_tokens == 1  # one token: no TPOT
    assert (ok[0].prompt_tokens, ok[0].cached_tokens) == (10, 5)
    s = summarize(run.results, run.wall_s, ideal_hit_rate=0.25)
    assert s["completed"] == 3 and s["errors"] == 1
    assert s["token_hit_rate"] == pytest.approx((5 + 3 + 4) / (10 + 7 + 9))
    assert s["output_tokens"] == 13
    assert s["output_tok_per_s"] == pytest.approx(13 / run.wall_s)
    assert s["input_tok_per_s"] == pytest.approx(26 / run.wall_s)
    assert FIRST_DELAY <= s["ttft_s"]["p50"] < FIRST_DELAY + 0.15
    assert "25.0%" in format_summary(s)


def test_closed_loop_waits_for_the_parent(server: FakeServer) -> None:
    reqs = [req(0, 3, 2), req(1, 3, 2, parent=0), req(2, 3, 2, parent=1), req(3, 3, 2)]
    run = asyncio.run(run_requests(reqs, ClientOptions(server.url, "m", concurrency=8)))
    assert all(r.ok for r in run.results)
    by_key = {tuple(e["key"]): e for e in server.log}
    for child, parent in ((1, 0), (2, 1)):
        assert by_key[(100 + child,) * 2]["arrive"] >= by_key[(100 + parent,) * 2]["done"]
    # the independent request is not held back behind the chain
    assert by_key[(103, 103)]["arrive"] < by_key[(100, 100)]["done"]


def test_arrival_times_and_duration_limit(server: FakeServer) -> None:
    reqs = [req(0, 3, 1, arrival_s=0.0), req(1, 3, 1, arrival_s=0.4), req(2, 3, 1, arrival_s=5.0)]
    opts = ClientOptions(server.url, "m", use_arrival_times=True, duration_limit=1.5)
    run = asyncio.run(run_requests(reqs, opts))
    sends = {r.index: r.send_s for r in run.results}
    assert sorted(sends) == [0, 1] and run.not_sent == 1
    assert sends[0] < 0.1 and 0.4 <= sends[1] < 0.55


def test_bench_serve_cli_writes_json(server: FakeServer, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    argv = ["serve", "--base-url", server.url, "--workload", "shared-prefix"]
    argv += ["--num-groups", "2", "--prompts-per-group", "2", "--system-len", "8"]
    argv += ["--question-len", "4", "--output-len", "2", "--warmup", "1", "--no-progress"]
    argv += ["--json", str(out)]
    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    data = json.loads(out.read_text())
    assert data["model"] == "fake-model" and data["flushed_after_warmup"] is True
    assert server.flushes == 1 and len(server.log) == 5  # 1 warm-up + 4 measured
    s = data["summary"]
    assert s["completed"] == 4 and s["errors"] == 0
    assert s["ideal_hit_rate"] == pytest.approx(2 * 8 / (4 * 12), abs=0.05)
    assert s["token_hit_rate"] == pytest.approx(0.5)
    assert len(data["requests"]) == 4 and data["workload"]["num_requests"] == 4
    assert all(e["body"]["stream"] and e["body"]["ignore_eos"] for e in server.log)

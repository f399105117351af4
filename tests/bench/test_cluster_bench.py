"""`radixkv bench cluster` end to end on its smallest setting: two tiny replicas behind the real
SGLang gateway (`smg`, cache_aware), six requests; the JSON's figures must agree with each other
(every request answered and attributed to one replica, the replicas' own counters equal to the
clients' usage) and the simulation must be computed on the same prompts."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from radixkv.cli import main


@pytest.mark.slow
def test_bench_cluster_smallest(tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:
    from radixkv.cluster.routers import RouterInstallError, router_python

    try:
        router_python("smg")
    except RouterInstallError as exc:
        if exc.offline:
            pytest.skip(str(exc))
        raise
    out = tmp_path / "cluster.json"
    argv = ["bench", "cluster", "--model", str(tiny_model_dir("llama")), "--replicas", "2"]
    argv += ["--num-slots", "512", "--configs", "cache_aware", "--concurrency", "2"]
    argv += ["--num-groups", "2", "--prompts-per-group", "3", "--system-len", "96"]
    argv += ["--question-len", "8", "--output-len", "2", "--no-progress", "--json", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    real = doc["real"]["cache_aware"]
    assert (real["completed"], real["errors"], real["unattributed"]) == (6, 0, 0)
    replicas = real["replicas"]
    assert sum(r["requests"] for r in replicas) == 6
    for row in replicas:
        assert row["server"]["finished_requests"] == row["requests"]
        assert row["server"]["prompt_tokens_total"] == row["prompt_tokens"]
        assert row["server"]["cached_prompt_tokens_total"] == row["cached_tokens"]
    assert real["prompt_tokens"] == doc["workload"]["prompt_tokens"]
    assert {r["replica"] for r in real["requests"]} <= {0, 1}
    sim = doc["simulation"]
    assert sim["ideal"]["prompt_tokens"] == real["prompt_tokens"]
    # Two 96-token prefixes (6 pages each) seen 3 times: the ideal caches 4 x 96 tokens.
    assert sim["ideal"]["cached_tokens"] == 4 * 96
    assert real["cached_tokens"] <= sim["ideal"]["cached_tokens"]

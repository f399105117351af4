"""The cluster benchmark's driver against two real `radixkv serve` replicas (tiny model), no
router: sending straight to one replica, every request must be attributed to that replica, and
the replicas' own counters must add up to what the clients saw."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from radixkv.bench.cluster.cluster_driver import ClusterRun, drive
from radixkv.bench.inputs.tokens import id_source
from radixkv.bench.inputs.workloads import shared_prefix
from radixkv.bench.serving.client import ClientOptions
from radixkv.bench.serving.server_proc import LocalServer

FLAGS = ("--num-slots", "2048", "--page-size", "16", "--no-compile", "--threads", "1")
FLAGS += ("--served-model-name", "tiny", "--log-level", "warning")


@pytest.fixture(scope="module")
def replicas(
    tiny_model_dir: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[str]]:
    logs = tmp_path_factory.mktemp("cluster-driver")
    model = str(tiny_model_dir("llama"))
    servers = [LocalServer(model, FLAGS, logs / f"r{i}.log", startup_timeout=300) for i in range(2)]
    try:
        for s in servers:
            s.start()
        yield [s.url for s in servers]
    finally:
        for s in servers:
            s.stop()


def _run(target: str, workers: list[str], concurrency: int) -> tuple[ClusterRun, int]:
    wl = shared_prefix(
        id_source(),
        num_groups=2,
        prompts_per_group=3,
        system_len=64,
        question_len=8,
        output_len=2,
        seed=int(np.random.default_rng().integers(1 << 30)),
    )
    opts = ClientOptions(base_url=target, model="tiny", concurrency=concurrency)
    run = asyncio.run(drive(wl.requests, opts, workers, tag=f"t{concurrency}"))
    return run, wl.prompt_tokens


@pytest.mark.slow
def test_driver_attributes_and_counts(replicas: list[str]) -> None:
    for target, conc in ((1, 1), (0, 3)):
        run, prompt = _run(replicas[target], replicas, conc)
        assert all(r.ok for r in run.results), run.errors
        assert run.replica_of == [target] * 6
        per = run.per_replica(2)
        assert per[1 - target] == {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0}
        assert per[target]["requests"] == 6 and per[target]["prompt_tokens"] == prompt
        own = run.replica_stats[target]
        assert own["finished_requests"] == 6
        assert own["prompt_tokens_total"] == prompt
        assert own["cached_prompt_tokens_total"] == per[target]["cached_tokens"]
        assert run.replica_stats[1 - target]["finished_requests"] == 0
        if conc == 1:  # in order: each group's later prompts reuse its 64-token prefix (4 pages)
            assert per[target]["cached_tokens"] == 4 * 64
        assert all(r.ttft_s is not None and r.ttft_s > 0 for r in run.results)

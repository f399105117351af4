"""`radixkv bench answers` against the real server and the real default model in bfloat16 (the
dtype `--dtype auto` serves on CPUs with native bf16): every question's greedy answer and its
log-probabilities are identical cold, after its system prompt was cached, and batched with the
others. (Before the invariant kernels, 8 of 16 answers changed with the cache in bf16.)"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from server_harness import LiveServer, live_server

from radixkv.bench.serving import answers
from radixkv.engine.engine import Engine
from radixkv.engine.types import EngineConfig

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def srv(default_model_dir: Path) -> Iterator[LiveServer]:
    config = EngineConfig(num_slots=8192, max_model_len=2048, dtype="bfloat16", compile=False)
    engine = Engine(str(default_model_dir), config)
    assert engine.lm.dtype == torch.bfloat16
    with live_server(engine, "smollm2") as server:
        yield server
    engine.close()


def test_one_answer_per_question(srv: LiveServer) -> None:
    parser = argparse.ArgumentParser()
    answers.add_args(parser)
    args = parser.parse_args(
        ["--url", srv.url, "--questions", "8", "--max-tokens", "12", "--logprobs"]
    )
    result = answers.run_check(args)
    assert result["questions"] == 8
    assert result["all_three"] == 8, [r for r in result["rows"] if not r["batched_same"]]
    assert all(r["cold"] for r in result["rows"])

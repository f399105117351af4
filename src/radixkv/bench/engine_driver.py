"""In-process workload driver for `radixkv bench engine`: feeds a workload into an Engine (closed
loop: a request with a parent is sent only once its parent finished; at most `concurrency`
requests in flight), steps the engine, and records TTFT and token counts per request."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from radixkv.bench.inputs.workloads import BenchRequest
from radixkv.engine.types import RequestOptions, SamplingParams


@dataclass
class RunRecord:
    """What one request did: TTFT from submission, prompt/cached/output token counts."""

    index: int
    submit_s: float
    ttft_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str | None = None


@dataclass
class RunResult:
    records: list[RunRecord]
    wall_s: float
    num_preemptions: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self, ideal_hit_rate: float | None = None) -> dict[str, Any]:
        ttft = np.asarray([r.ttft_s for r in self.records if r.ttft_s is not None], dtype=float)
        prompt = sum(r.prompt_tokens for r in self.records)
        cached = sum(r.cached_tokens for r in self.records)
        output = sum(r.output_tokens for r in self.records)
        wall = max(self.wall_s, 1e-9)
        return {
            "requests": len(self.records),
            "wall_s": self.wall_s,
            "ttft_mean_s": float(ttft.mean()) if ttft.size else None,
            "ttft_p50_s": float(np.percentile(ttft, 50)) if ttft.size else None,
            "ttft_p99_s": float(np.percentile(ttft, 99)) if ttft.size else None,
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "output_tokens": output,
            "output_tok_per_s": output / wall,
            "effective_input_tok_per_s": prompt / wall,
            "token_hit_rate": cached / prompt if prompt else 0.0,
            "ideal_hit_rate": ideal_hit_rate,
            "preemptions": self.num_preemptions,
        }


def drive(
    engine: Any,
    requests: list[BenchRequest],
    concurrency: int,
    namespace: str | None = None,
) -> RunResult:
    """Run `requests` to completion on `engine`; greedy, ignore_eos (fixed output lengths)."""
    options = RequestOptions(cache_salt=namespace)
    waiting = list(requests)  # list order is the submission order among eligible requests
    done: set[int] = set()
    inflight: dict[str, RunRecord] = {}
    records: dict[int, RunRecord] = {}
    pre0 = engine.metrics().num_preemptions
    start = time.perf_counter()
    while waiting or inflight:
        i = 0
        while len(inflight) < concurrency and i < len(waiting):
            req = waiting[i]
            if req.parent is not None and req.parent not in done:
                i += 1
                continue
            waiting.pop(i)
            sp = SamplingParams(max_tokens=req.max_tokens, temperature=0.0, ignore_eos=True)
            rid = engine.add_request(req.prompt_ids, sp, options=options)
            rec = RunRecord(req.index, time.perf_counter(), prompt_tokens=len(req.prompt_ids))
            inflight[rid] = rec
            records[req.index] = rec
        if not inflight:
            raise RuntimeError("workload has requests whose parents never run")
        deltas = engine.step()
        now = time.perf_counter()
        for d in deltas:
            got = inflight.get(d.request_id)
            if got is None:
                continue
            if d.new_token_ids and got.ttft_s is None:
                got.ttft_s = now - got.submit_s
            got.output_tokens = d.completion_tokens
            got.cached_tokens = d.cached_tokens
            if d.finished:
                got.e2e_s = now - got.submit_s
                got.finish_reason = d.finish_reason
                done.add(got.index)
                del inflight[d.request_id]
    wall = time.perf_counter() - start
    ordered = [records[k] for k in sorted(records)]
    return RunResult(ordered, wall, engine.metrics().num_preemptions - pre0)


def load_for_bench(args: argparse.Namespace) -> tuple[Any, Any, str, Any]:
    """The in-process benchmarks' common start: torch threads from `--threads`, the engine config
    from the engine flags, and the model loaded once on its resolved device and dtype, so every
    configuration a benchmark builds shares one copy of the weights.
    (config, LoadedModel, device, dtype)."""
    import torch

    from radixkv.engine import setup
    from radixkv.engine.args import engine_config_from_args

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    base = engine_config_from_args(args)
    device = setup.resolve_device(base.model.device)
    dtype = setup.resolve_dtype(base.model.dtype, device)
    return base, setup.load(base.model.path, device, dtype), device, dtype

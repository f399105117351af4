"""No starvation under LPM: a cached prefix buys a request at most `schedule_wait_budget_s` of
arrival order, so a cold prompt is admitted soon even while a steady stream of warm requests
(which LPM ranks first) keeps the queue full.

The simulations drive a real engine over the toy models with a virtual clock: step k happens at
k * DT seconds and every request's `arrival` is stamped with it, so the order (and every figure
below) is the same on every machine."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_helpers import make_engine
from engine_toy_hybrid import ToyHybridConfig, ToyHybridLM

from radixkv.engine.engine import Engine
from radixkv.engine.request import Request
from radixkv.engine.types import RequestOptions, SamplingParams

DT = 0.02  # virtual seconds per engine step
WARM = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
COLD = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def _stamp(engine: Engine, rid: str, t: float) -> Request:
    req = next(r for r in engine.scheduler.waiting if r.request_id == rid)
    req.arrival = t
    return req


@dataclass(repr=False)  # failures show the assertion, not every request
class Run:
    warm_latency: list[float] = field(default_factory=list)  # virtual seconds, finished warm
    cold_ttft: dict[str, float] = field(default_factory=dict)
    # (request, virtual admission time) in admission order
    admitted: list[tuple[Request, float]] = field(default_factory=list)
    cold: list[Request] = field(default_factory=list)


def simulate(
    engine: Engine,
    *,
    steps: int = 300,
    clients: int = 12,
    cold_at: int = 40,
    n_cold: int = 2,
    warm_options: RequestOptions | None = None,
) -> Run:
    """`clients` warm clients in a closed loop (a shared 96-token prefix + 8 new tokens, 12 out)
    and `n_cold` cold 96-token prompts sent at step `cold_at`; `steps` engine steps."""
    rng = random.Random(0)

    def rand(n: int) -> list[int]:
        return [rng.randrange(38) for _ in range(n)]

    prefix = rand(96)
    run = Run()
    sent: dict[str, tuple[str, float]] = {}  # rid -> (kind, arrival)
    seen: set[int] = set()

    def send_warm(t: float) -> None:
        rid = engine.add_request(prefix + rand(8), WARM, options=warm_options)
        _stamp(engine, rid, t)
        sent[rid] = ("warm", t)

    for _ in range(clients):
        send_warm(0.0)
    for step in range(steps):
        now = step * DT
        if step == cold_at:
            for _ in range(n_cold):
                rid = engine.add_request(rand(96), COLD)
                run.cold.append(_stamp(engine, rid, now))
                sent[rid] = ("cold", now)
        deltas = engine.step()
        engine.check_memory()
        for req in engine.scheduler.running:
            if id(req) not in seen:
                seen.add(id(req))
                run.admitted.append((req, now))
        done = now + DT
        for d in deltas:
            kind, t0 = sent[d.request_id]
            if kind == "cold" and d.new_token_ids and d.request_id not in run.cold_ttft:
                run.cold_ttft[d.request_id] = done - t0
            if kind == "warm" and d.finished:
                run.warm_latency.append(done - t0)
                send_warm(done)  # the client sends its next request at once
    return run


def _mean_warm(run: Run) -> float:
    return sum(run.warm_latency) / len(run.warm_latency)


def _check_bound(run: Run, engine: Engine) -> None:
    """Every cold request got its first token, no later than the budget plus two mean warm
    latencies (about what arrival order would take), and no request that arrived more than the
    budget after it was admitted before it."""
    assert len(run.cold_ttft) == len(run.cold), "a cold request never got its first token"
    budget = engine.config.scheduler.schedule_wait_budget_s
    for cold in run.cold:
        assert run.cold_ttft[cold.request_id] <= budget + 2 * _mean_warm(run)
        admitted_at = next(t for r, t in run.admitted if r is cold)
        passed = [r for r, t in run.admitted if t < admitted_at and r.arrival > cold.arrival]
        assert all(r.arrival <= cold.arrival + budget + 1e-9 for r in passed)


def test_cold_requests_are_not_starved_by_a_warm_stream() -> None:
    engine = make_engine(max_running_requests=4)  # lpm and the default wait budget
    run = simulate(engine)
    _check_bound(run, engine)
    assert max(run.cold_ttft.values()) <= 4 * _mean_warm(run)
    # The warm stream keeps hitting its prefix.
    assert engine.metrics().cached_prompt_tokens_total >= 0.8 * 96 * len(run.warm_latency)


@pytest.mark.parametrize("budget", [0.0, 2.0])
def test_wait_budget_bounds_how_far_lpm_reorders(budget: float) -> None:
    engine = make_engine(max_running_requests=4, schedule_wait_budget_s=budget)
    _check_bound(simulate(engine), engine)


def test_bound_holds_with_priority_eviction() -> None:
    # The `priority` eviction policy keeps the warm stream's prefix (priority 5) resident; the
    # admission order is the scheduler's alone, so the bound is the same.
    engine = make_engine(max_running_requests=4, eviction_policy="priority")
    _check_bound(simulate(engine, warm_options=RequestOptions(priority=5)), engine)


def test_bound_holds_on_a_hybrid_model() -> None:
    lm = ToyHybridLM(ToyHybridConfig(kinds=("full", "swa", "state", "swa"), window=8))
    engine = make_engine(lm, max_running_requests=4, state_checkpoint_interval=16)
    _check_bound(simulate(engine), engine)
    assert engine.metrics().cached_prompt_tokens_total > 0


@pytest.mark.slow
def test_bound_holds_on_a_tiny_llama(tiny_model_dir: Callable[..., Path]) -> None:
    from radixkv.model import load_model

    lm = load_model(str(tiny_model_dir("llama")), "cpu", torch.float32)
    engine = make_engine(lm, max_running_requests=4)
    _check_bound(simulate(engine), engine)


def _queued(engine: Engine, prompts: dict[str, tuple[list[int], float]]) -> dict[str, Any]:
    reqs = {}
    for name, (prompt, t) in prompts.items():
        rid = engine.add_request(prompt, COLD, request_id=name)
        reqs[name] = _stamp(engine, rid, t)
    return reqs


@pytest.mark.parametrize("budget", [0.0, 1.0, 5.0])
def test_lpm_order_ages_by_arrival(budget: float) -> None:
    rng = random.Random(1)
    prefix = [rng.randrange(38) for _ in range(64)]
    engine = make_engine(schedule_wait_budget_s=budget)
    engine.generate([[*prefix, 1]], COLD)  # the prefix is cached now
    _queued(
        engine,
        {
            "cold": ([rng.randrange(38) for _ in range(40)], 10.0),
            "half": (prefix[:32] + [2] * 8, 10.4),
            "warm-early": ([*prefix, 3], 10.5),
            "warm-late": ([*prefix, 4], 11.5),
        },
    )
    order = [r.request_id for r in engine.scheduler._waiting_order()]
    expected = {
        # arrival order
        0.0: ["cold", "half", "warm-early", "warm-late"],
        # keys: cold 10.0, half 10.4 - 0.5 = 9.9, warm-early 9.5, warm-late 10.5
        1.0: ["warm-early", "half", "cold", "warm-late"],
        # every arrival lies within the budget: plain longest prefix first
        5.0: ["warm-early", "warm-late", "half", "cold"],
    }[budget]
    assert order == expected


def test_fcfs_ignores_the_budget() -> None:
    rng = random.Random(2)
    prefix = [rng.randrange(38) for _ in range(64)]
    engine = make_engine(schedule_policy="fcfs", schedule_wait_budget_s=5.0)
    engine.generate([[*prefix, 1]], COLD)
    _queued(engine, {"cold": ([5] * 40, 1.0), "warm": ([*prefix, 3], 2.0)})
    assert [r.request_id for r in engine.scheduler._waiting_order()] == ["cold", "warm"]

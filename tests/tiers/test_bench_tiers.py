"""`radixkv bench tiers`: the multi-turn workload and its accounting (against naive references),
the server flags of each mode, and end-to-end runs through real `radixkv serve` processes on
tiny checkpoints (a Llama: every mode and the restart; a Gemma 3 hybrid: the L1 row)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from radixkv.bench.serving.client import RequestResult
from radixkv.bench.tiers import multiturn as mt
from radixkv.bench.tiers.cli import MODES, l1_slots, mode_flags, mode_slots
from radixkv.cli import build_parser, main


def _naive_ideal(prompts: list[list[int]]) -> list[int]:
    """Per prompt, the longest common prefix with any earlier prompt, by brute force."""
    out = []
    for i, p in enumerate(prompts):
        best = 0
        for q in prompts[:i]:
            n = 0
            while n < min(len(p), len(q)) and p[n] == q[n]:
                n += 1
            best = max(best, n)
        out.append(best)
    return out


def test_rounds_extend_each_history_by_answer_and_turn() -> None:
    shape = mt.Shape(clients=3, rounds=4, turn_len=5, output_len=2)
    rounds = mt.build_rounds(shape, seed=1, vocab=5000)
    assert rounds == mt.build_rounds(shape, seed=1, vocab=5000)
    assert rounds != mt.build_rounds(shape, seed=2, vocab=5000)
    assert [len(r) for r in rounds] == [3] * 4
    for r, prompts in enumerate(rounds, start=1):
        assert {len(p) for p in prompts} == {shape.prompt_len(r)} == {r * 5 + (r - 1) * 2}
        for c, p in enumerate(prompts):
            assert all(mt.ID_LO <= t < 5000 for t in p)
            if r > 1:
                prev = rounds[r - 2][c]
                assert p[: len(prev)] == prev  # the whole history, then 2 answer + 5 new ids
                assert p[len(prev) : len(prev) + 2] != rounds[r - 1][c][:2]
    assert shape.working_set == 3 * 4 * 7
    with pytest.raises(ValueError):
        mt.Shape(clients=0)
    with pytest.raises(ValueError):
        mt.build_rounds(shape, vocab=mt.ID_LO)


def test_ideal_per_round_matches_brute_force_and_closed_form() -> None:
    shape = mt.Shape(clients=4, rounds=5, turn_len=6, output_len=3)
    rounds = mt.build_rounds(shape, seed=3)
    naive = _naive_ideal([p for prompts in rounds for p in prompts])
    per_round = [sum(naive[i * 4 : (i + 1) * 4]) for i in range(5)]
    assert mt.ideal_per_round(rounds) == per_round
    # every earlier prompt of the conversation is cached: round r hits the round r-1 prompt
    assert per_round == [0] + [4 * shape.prompt_len(r - 1) for r in range(2, 6)]
    total = sum(len(p) for prompts in rounds for p in prompts)
    assert mt.ideal_speedup(rounds) == pytest.approx(total / (total - sum(per_round)))


def _res(prompt: int, cached: int, ok: bool = True) -> RequestResult:
    return RequestResult(0, "c0", ok, None if ok else "boom", 0.0, 0.1, 0.5, 0.05, prompt, cached)


def test_round_records_pool_rates_over_tokens() -> None:
    assert mt.last_rounds(16) == list(range(11, 17))
    assert mt.last_rounds(3) == [3] and mt.last_rounds(1) == [1]
    rows = [
        mt.round_record(1, [_res(100, 0), _res(100, 0)], 2.0, 0, 200, {}),
        mt.round_record(2, [_res(300, 200), _res(300, 100, ok=False)], 1.0, 400, 600, {}),
        mt.round_record(3, [_res(500, 400), _res(500, 300)], 2.0, 600, 1000, {"host": 300}),
    ]
    assert rows[1]["errors"] == 1 and rows[1]["prompt_tokens"] == 300
    assert rows[1]["token_hit_rate"] == pytest.approx(200 / 300)
    assert rows[2]["ideal_hit_rate"] == pytest.approx(0.6)
    s = mt.mode_summary(rows)
    assert s["prompt_tokens"] == 1500 and s["cached_tokens"] == 900 and s["errors"] == 1
    assert s["effective_input_tok_per_s"] == pytest.approx(1500 / 5.0)
    assert s["token_hit_rate"] == pytest.approx(900 / 1500)  # pooled, not a mean of rates
    assert s["ideal_hit_rate"] == pytest.approx(1000 / 1800)
    assert s["last_rounds"] == [3, 3]
    assert s["last_hit_rate"] == pytest.approx(0.7) and s["last_ideal_hit_rate"] == 0.6
    modes = {"L1": {"summary": s}, "L1+L2": {"summary": {**s, "effective_input_tok_per_s": 600}}}
    assert mt.speedups(modes) == {"L1": 1.0, "L1+L2": pytest.approx(2.0)}
    assert mt.speedups({"L1+L2": modes["L1+L2"]}) == {}


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", "tiers", *argv])


def test_mode_flags_leave_the_tier_policies_at_their_defaults() -> None:
    args = _args("--server-arg=--no-compile")
    shape = mt.Shape()
    slots = l1_slots(shape, 1 / 3, 16, 2)
    assert slots % 16 == 0 and shape.working_set / 3 <= slots < shape.working_set / 3 + 16
    assert l1_slots(shape, 0.01, 16, 2) >= 2 * (shape.prompt_len(16) + 8)  # in flight fit
    flags = {m: mode_flags(m, args, slots, "/l3") for m in MODES}
    assert flags["L1"] == ["--page-size", "16", "--num-slots", str(slots), "--no-compile"]
    assert "--enable-hierarchical-cache" in flags["L1+L2"]
    assert "--hicache-storage-backend" not in flags["L1+L2"]
    file_l3 = ["--hicache-storage-backend", "file", "--hicache-storage-url", "/l3"]
    assert flags["L1+L2+L3"][-5:-1] == file_l3
    assert not any("prefetch" in f or "write-policy" in f for f in flags["L1+L2+L3"])
    redis = mode_flags("L1+L2+L3", _args("--storage-url", "redis://h:1/0"), slots, "/l3")
    redis_l3 = ["--hicache-storage-backend", "redis", "--hicache-storage-url", "redis://h:1/0"]
    assert redis[-4:] == redis_l3
    # L1-all: no tier flags, and a pool for the whole working set plus the requests in flight
    assert flags["L1-all"] == flags["L1"]
    args = _args()
    assert mode_slots("L1", shape, args) == slots
    everything = mode_slots("L1-all", shape, args)
    assert everything % 16 == 0
    assert everything >= shape.working_set + 2 * (shape.prompt_len(16) + 8)


def _run(tmp_path: Path, model: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "tiers.json"
    argv = ["bench", "tiers", "--model", str(model), "--dtype", "float32", "--page-size", "4"]
    argv += ["--clients", "2", "--rounds", "3", "--turn-len", "32", "--output-len", "2"]
    argv += ["--concurrency", "1", "--l1-frac", "0.1", "--server-arg=--no-compile"]
    argv += ["--log-dir", str(tmp_path / "logs"), "--json", str(out), *extra]
    assert main(argv) == 0
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def _check_accounting(mode: dict[str, Any], page: int = 4) -> None:
    assert [r["round"] for r in mode["rounds"]] == [1, 2, 3]
    for r in mode["rounds"]:
        assert r["errors"] == 0 and r["prompt_tokens"] == r["sent_prompt_tokens"]
        assert r["cached_tokens"] % page == 0
        assert r["cached_tokens"] <= r["ideal_cached_tokens"]
        assert sum(r["hits_by_tier"].values()) == r["cached_tokens"]


@pytest.mark.slow
def test_bench_tiers_through_servers(
    tmp_path: Path, tiny_model_dir: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    model = tiny_model_dir("llama")
    # wait_complete: on a tiny model recomputing is always cheaper than loading, so the default
    # cost_aware policy would (rightly) not wait, and what the tiers serve would depend on timing
    policy = "--server-arg=--hicache-storage-prefetch-policy=wait_complete"
    modes = "L1,L1+L2+L3,L1-all"
    res = _run(tmp_path, model, "--modes", modes, "--prefix-len", "64", policy)
    assert res["dtype"] == "float32"
    l1, l3, every = res["modes"]["L1"], res["modes"]["L1+L2+L3"], res["modes"]["L1-all"]
    for mode in (l1, l3, every):
        _check_accounting(mode)
    # L1-all evicts nothing: every earlier page of every conversation hits, from the device.
    for r in every["rounds"]:
        earlier = mt.Shape(2, 3, 32, 2).prompt_len(r["round"] - 1) if r["round"] > 1 else 0
        assert r["cached_tokens"] == 2 * (earlier // 4 * 4)
        assert r["hits_by_tier"].get("device", 0) == r["cached_tokens"]
    # L1 (108 slots: one round-3 request and its answer) cannot keep both conversations; the
    # tiers hit every earlier page of both in round 3.
    assert l1["num_slots"] == 108
    assert l3["rounds"][2]["cached_tokens"] == 2 * (mt.Shape(2, 3, 32, 2).prompt_len(2) // 4 * 4)
    assert l1["rounds"][2]["cached_tokens"] < l3["rounds"][2]["cached_tokens"]
    assert l3["rounds"][2]["hits_by_tier"]["host"] + l3["rounds"][2]["hits_by_tier"]["storage"]
    device = sum(r["hits_by_tier"].get("device", 0) for r in l1["rounds"])
    assert device == l1["summary"]["cached_tokens"]
    assert res["restart"]["with_l3"]["cached_tokens"] == 64
    assert res["restart"]["without_l3"]["cached_tokens"] == 0
    assert set(res["speedup_vs_L1"]) == {"L1", "L1+L2+L3", "L1-all"}
    text = capsys.readouterr().out
    assert "restart, 64-token prefix" in text and "L1+L2+L3" in text


@pytest.mark.slow
def test_bench_tiers_hybrid_model(tmp_path: Path, tiny_model_dir: Callable[..., Path]) -> None:
    """A hybrid (Gemma 3: sliding window + full attention) runs its L1 row; a tier row either
    runs with the same accounting or reports the server's refusal, and the run goes on."""
    model = tiny_model_dir("gemma3")
    chunk = "--server-arg=--chunked-prefill-size=64"  # the SWA pool needs window + one chunk
    res = _run(tmp_path, model, "--modes", "L1,L1+L2", "--skip-restart", chunk)
    _check_accounting(res["modes"]["L1"])
    tier = res["modes"]["L1+L2"]
    if "error" in tier:
        assert "not supported for hybrid models" in tier["error"]
    else:
        _check_accounting(tier)

"""`radixkv bench agent`: the tool-list generator hits its token budget, the Hermes view renders a
history whose earlier prompt is a prefix of the next one, the report's arithmetic, and a short run
against a real `radixkv serve` on the tiny seeded model whose JSON agrees with the server."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest

from radixkv.bench.agent import agent_report
from radixkv.bench.agent.agent_model import HERMES_CHATML, hermes_view, renders_tools
from radixkv.bench.agent.agent_session import AgentShape, Reply, TurnRecord, _follow_up, build_plan
from radixkv.bench.agent.agent_tools import filler, system_with_tools, tool_list, tools_text
from radixkv.bench.inputs.tokens import load_tokenizer


@pytest.fixture(scope="module")
def count(default_model_dir: Path) -> Callable[[str], int]:
    tok = load_tokenizer(default_model_dir)
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


@pytest.mark.parametrize("budget", [64, 2000, 6000, 8000])
def test_tool_list_hits_its_token_budget(count: Callable[[str], int], budget: int) -> None:
    for seed in (0, 1):
        tools = tool_list(count, budget, seed)
        n = count(tools_text(tools))
        assert budget - max(8, budget // 100) <= n <= budget, (seed, n)
        names = [t["function"]["name"] for t in tools]
        assert len(set(names)) == len(names)
        for t in tools:
            assert t["type"] == "function"
            jsonschema.Draft202012Validator.check_schema(t["function"]["parameters"])
    assert tool_list(count, budget, 3) == tool_list(count, budget, 3)
    if budget >= 2000:  # a realistic list: many tools of a few hundred tokens
        assert len(tool_list(count, budget, 0)) >= budget // 400
        assert tool_list(count, budget, 0) != tool_list(count, budget, 1)


def test_filler_and_the_plan_are_sized_and_seeded(count: Callable[[str], int]) -> None:
    rng = random.Random(0)
    for n in (1, 30, 300, 3000):
        assert n - 3 <= count(filler(count, n, rng)) <= n
    shape = AgentShape(sessions=2, turns=3, tools_tokens=500, result_tokens=(20, 40))
    plan = build_plan(shape, count)
    assert plan.tools == build_plan(shape, count).tools
    assert plan.results == build_plan(shape, count).results
    assert all(20 <= n <= 40 for row in plan.result_lens for n in row)
    assert all(50 <= n <= 200 for row in plan.max_tokens for n in row)
    assert plan.tasks[0] != plan.tasks[1]
    system = AgentShape(tools_mode="system", tools_tokens=500)
    text = build_plan(system, count).first_messages(0)[0]["content"]
    assert text == system_with_tools(plan.system, plan.tools)


def test_hermes_view_renders_tools_and_keeps_prompts_prefixes(
    default_model_dir: Path, tmp_path: Path, count: Callable[[str], int]
) -> None:
    from radixkv.model.tokenizer import Tokenizer

    assert not renders_tools(default_model_dir)
    view = hermes_view(default_model_dir, tmp_path)
    assert renders_tools(view) and (view / "model.safetensors").exists()
    tok = Tokenizer.from_pretrained(view)
    assert tok.chat_template == HERMES_CHATML
    tools = tool_list(count, 300)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Fix it."}]
    first = tok.render_chat(msgs, True, tools=tools)
    assert "Be brief." in first and tools_text(tools) in first
    reply = Reply("Let me look.")
    reply.calls[0] = {
        "id": "c1",
        "type": "function",
        "function": {"name": tools[0]["function"]["name"], "arguments": '{"a": 1}'},
    }
    turn2 = [*msgs, *_follow_up(reply, "file contents")]
    second = tok.render_chat(turn2, True, tools=tools)
    # The cache can serve the whole earlier prompt, and the reply as the template shows it.
    assert second.startswith(first + 'Let me look.\n<tool_call>\n{"name": ')
    assert "<tool_response>\nfile contents\n</tool_response>" in second
    plain = [*msgs, *_follow_up(Reply("Done."), "ok, next")]
    assert tok.render_chat(plain, True, tools=tools).startswith(first + "Done.<|im_end|>")


def _rec(s: int, t: int, prompt: int, cached: int, out: int = 10, ttft: float = 0.1) -> TurnRecord:
    return TurnRecord(s, t, True, None, 0.0, ttft, 0.01, ttft + 0.1, prompt, cached, out)


def test_report_pools_rates_and_checks_the_target() -> None:
    recs = [
        _rec(0, 1, 1000, 0),
        _rec(0, 2, 1100, 1050),
        _rec(0, 3, 1200, 1180),
        _rec(1, 1, 1000, 900),
        _rec(1, 2, 1100, 1000),
    ]
    rows = {r["turn"]: r for r in agent_report.per_turn(recs)}
    assert rows[2]["hit_rate"] == pytest.approx(2050 / 2200)
    assert rows[2]["hit_rate_min"] == pytest.approx(1000 / 1100)
    assert rows[2]["computed_tokens_mean"] == pytest.approx(75)
    assert rows[2]["reusable_rate"] == pytest.approx(2020 / 2200)  # previous prompt + answer
    s = agent_report.summary(recs, 10.0, {0: "done", 1: "context"})
    assert s["hit_rate_after_first"] == pytest.approx(3230 / 3400)
    assert s["turns_after_first"] == 3 and s["turns_meeting_target"] == 2
    assert s["target_met"] is False and s["sessions_ended"] == {"0": "done", "1": "context"}
    recs[4].cached_tokens = 1090
    assert agent_report.summary(recs, 10.0, {})["target_met"] is True
    bins = agent_report.ttft_by_history(recs, width=1000)
    assert [b["turns"] for b in bins] == [3]
    failed = TurnRecord(2, 1, error="HTTP 500")
    s = agent_report.summary([*recs, failed], 10.0, {})
    assert s["turns_failed"] == 1 and s["first_errors"] == ["HTTP 500"]
    run = {
        "engine": "radixkv",
        "dtype": "float32",
        "summary": s,
        "turns": agent_report.per_turn(recs),
    }
    text = agent_report.format_run(run)
    assert "| 2 | 1100 | 1070 | 30 | 97.3% (95.5%)" in text and "target met" in text
    slower = json.loads(json.dumps(s))
    slower["ttft_s"]["mean"] = 0.4
    table = agent_report.compare([run, {**run, "engine": "vllm", "summary": slower}])
    assert "| float32 | hit rate after turn 1 | 97.6% | 97.6% | 1.00x |" in table
    assert "| float32 | TTFT mean (ms) | 100 | 400 | 0.25x |" in table


def _probe(after: float, alone: float) -> dict[str, object]:
    side = {"ttft_median_s": 0.0, "computed_tokens": [260]}
    return {
        "history_tokens": 32301,
        "new_tokens": 256,
        "alone": {**side, "ttft_median_s": alone},
        "after_history": {**side, "ttft_median_s": after},
        "ttft_ratio": after / alone,
    }


def test_report_of_a_probe_only_run() -> None:
    """`--probe-only` runs have no agent turns: the report shows their probes side by side."""
    ours = {"engine": "radixkv", "dtype": "bfloat16", "probe": _probe(0.714, 0.265)}
    peer = {"engine": "vllm", "dtype": "bfloat16", "probe": _probe(1.143, 0.241)}
    text = agent_report.format_run(ours)
    assert text.startswith("## radixkv (bfloat16)") and "after 32301 cached tokens 714 ms" in text
    assert "2.69x" in text
    table = agent_report.compare([ours, peer])
    assert "| bfloat16 | probe TTFT after history (ms) | 714 | 1143 | 0.62x |" in table
    assert "| bfloat16 | probe TTFT alone (ms) | 265 | 241 | 1.10x |" in table
    assert "hit rate" not in table


def test_bench_agent_against_our_server(
    tiny_model_dir: Callable[..., Path], tmp_path: Path
) -> None:
    from radixkv.cli import main

    model = tiny_model_dir("llama")
    argv = [
        "bench",
        "agent",
        "--model",
        str(model),
        "--dtypes",
        "float32",
        "--sessions",
        "2",
        "--turns",
        "3",
        "--tools-tokens",
        "300",
        "--system-tokens",
        "40",
        "--task-tokens",
        "20",
        "--result-tokens",
        "20:40",
        "--answer-tokens",
        "8:16",
        "--probe-history",
        "400",
        "--probe-new",
        "32",
        "--probe-reps",
        "2",
        "--warmup",
        "1",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    out = json.loads((tmp_path / "agent.json").read_text())
    (run,) = out["runs"]
    assert run["engine"] == "radixkv" and "hermes-tools" in run["server"]["command"]
    recs = run["records"]
    assert len(recs) == 6 and all(r["ok"] for r in recs)
    by = {(r["session"], r["turn"]): r for r in recs}
    for (s, t), r in by.items():
        if t > 1:  # the whole earlier prompt (page size 1) is served from the cache
            assert r["cached_tokens"] >= by[(s, t - 1)]["prompt_tokens"], r
        assert (
            r["completion_tokens"] == out["shape"]["answer_tokens"][0]
            or 8 <= r["completion_tokens"] <= 16
        )
    later = [r for r in recs if r["turn"] > 1]
    pooled = sum(r["cached_tokens"] for r in later) / sum(r["prompt_tokens"] for r in later)
    assert run["summary"]["hit_rate_after_first"] == pytest.approx(pooled)
    assert run["summary"]["turns_after_first"] == 4
    probe = run["probe"]
    assert probe["history_tokens"] >= 380 and probe["ttft_ratio"] > 0
    assert all(c >= 380 for c in probe["after_history"]["cached_tokens"])
    assert all(c < 60 for c in probe["alone"]["cached_tokens"])
    md = (tmp_path / "agent.md").read_text()
    assert "| turn | prompt | cached |" in md and "TTFT probe" in md

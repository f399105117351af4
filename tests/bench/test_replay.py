"""Trace replay against the real caches, checked by independent (naive) computations."""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from radixkv.bench.inputs.traces import TraceRequest, load_claude_code, load_mooncake
from radixkv.bench.replay import POLICIES, default_capacities, make_factory, replay, replay_grid
from radixkv.bench.replay_cli import parse_tokens, register

# The public traces ship with the repository (data/traces/README.md).
TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"
MOONCAKE_CONV = TRACES / "mooncake-fast25" / "conversation_trace.jsonl"


def req(ids: Sequence[int], length: int | None = None, bs: int = 4, t: float = 0.0) -> TraceRequest:
    n = len(ids) * bs if length is None else length
    return TraceRequest(t, n, 1, np.asarray(ids, dtype=np.int64), bs)


def random_trace(seed: int, n: int = 60, bs: int = 4) -> list[TraceRequest]:
    """Chained-id conversations: a turn extends an earlier request of its conversation or starts
    from a shared system prefix; lengths often end inside a block (partial last block)."""
    rng = random.Random(seed)
    next_id = 3
    system = [0, 1, 2]
    convs: list[list[int]] = []
    out: list[TraceRequest] = []
    for i in range(n):
        if out and rng.random() < 0.15:  # a retry: an earlier prompt again, maybe shorter
            prev = rng.choice(out)
            out.append(req(prev.hash_ids.tolist(), prev.input_length - rng.randint(0, 1), bs, i))
            continue
        if convs and rng.random() < 0.7:
            base = rng.choice(convs)
            base = base[: rng.randint(1, len(base))]  # sometimes a branch (edited history)
        else:
            base = system[: rng.randint(0, 3)]
        ids = base + list(range(next_id, next_id + rng.randint(1, 3)))
        next_id += 3
        convs.append(ids)
        length = len(ids) * bs - rng.randint(0, bs - 1)
        out.append(req(ids, length, bs, float(i)))
    return out


def naive_ideal(requests: Sequence[TraceRequest], page: int) -> tuple[int, int]:
    """(hit tokens, hit blocks) at infinite capacity: a set of every cached page-aligned prefix."""
    cached: set[tuple[int, ...]] = set()
    hit_tokens = hit_blocks = 0
    for r in requests:
        toks = tuple(r.token_ids().tolist())
        full = len(toks) // page * page
        hit = 0
        for k in range(page, full + 1, page):
            if toks[:k] not in cached:
                break
            hit = k
        hit_tokens += hit
        ends = [min((i + 1) * r.block_size, r.input_length) for i in range(r.num_blocks)]
        hit_blocks += sum(end <= hit for end in ends)
        cached.update(toks[:k] for k in range(page, full + 1, page))
    return hit_tokens, hit_blocks


@pytest.mark.parametrize("kind", ["radix", "blockhash"])
@pytest.mark.parametrize("page", [1, 2, 4])
def test_infinite_capacity_equals_naive_prefix_set(kind: str, page: int) -> None:
    trace = random_trace(seed=page)
    res = replay(trace, make_factory(kind, page, "lru"), None, check_every=7)
    assert (res.hit_tokens, res.hit_blocks) == naive_ideal(trace, page)
    assert res.hit_tokens > 0 and res.evicted_tokens == 0
    assert res.input_tokens == sum(r.input_length for r in trace)
    # A capacity larger than everything ever inserted behaves exactly like the ideal.
    big = replay(trace, make_factory(kind, page, "lru"), 10**9)
    assert (big.hit_tokens, big.evicted_tokens) == (res.hit_tokens, 0)


def test_hand_built_lru_replay() -> None:
    # Blocks of 4 tokens, page 4, capacity 12 tokens. A..E, X are distinct blocks.
    a, b, c, d, e, x = 10, 11, 12, 13, 14, 15
    trace = [req([a, b]), req([c, d]), req([a, b]), req([a, b, e]), req([a, x]), req([a, b])]
    res = replay(trace, make_factory("radix", 4, "lru"), 12, policy="lru", check_every=1)
    # Page-granular: each overflow of 4 tokens frees one page, the tail of the LRU leaf.
    # 1 [A B] miss (8 cached). 2 [C D] miss, 16 > 12: the LRU leaf [A B] loses B. 3 [A B] hits
    # A; [C D] loses D. 4 [A B E] hits 8; [C] goes. 5 [A X] hits 4; the LRU leaf is [E] (used
    # at 4, [X] at 5). 6 [A B] hits 8.
    assert res.hit_tokens == 4 + 8 + 4 + 8
    assert res.evicted_tokens == 4 * 4
    assert res.hit_blocks == 1 + 2 + 1 + 2
    assert res.input_tokens == 8 + 8 + 8 + 12 + 8 + 8 and res.requests == 6
    assert res.final_size == 12 and res.peak_size == 16
    assert res.token_hit_rate == pytest.approx(24 / 52)
    # The cache's own accounting agrees with the replay's.
    st = res.cache_stats
    assert (st["matched_tokens"], st["requested_tokens"]) == (24, 52)
    assert (st["evicted_tokens"], st["match_calls"], st["insert_calls"]) == (16, 6, 6)


def nested_workload(seed: int, sessions: int = 6, turns: int = 8) -> list[TraceRequest]:
    """Interleaved conversations, each turn extending the previous one (nested prefixes)."""
    rng = random.Random(seed)
    next_id = 1
    hist: list[list[int]] = [[0] for _ in range(sessions)]  # block 0: a shared system prompt
    out: list[TraceRequest] = []
    for t in range(sessions * turns):
        s = rng.randrange(sessions)
        hist[s] = hist[s] + list(range(next_id, next_id + rng.randint(1, 3)))
        next_id += 3
        out.append(req(hist[s], None, 4, float(t)))
    return out


@pytest.mark.parametrize("kind", ["radix", "blockhash"])
def test_lru_hit_rate_is_monotone_in_capacity(kind: str) -> None:
    trace = nested_workload(seed=1)
    ideal = replay(trace, make_factory(kind, 4, "lru"), None).hit_tokens
    hits = [
        replay(trace, make_factory(kind, 4, "lru"), cap).hit_tokens for cap in range(4, 320, 12)
    ]
    assert hits == sorted(hits), hits
    assert hits[0] < hits[-1] <= ideal


def write_claude(path: Path, sid: str, ids_per_turn: list[list[int]]) -> None:
    reqs = [
        {"t": float(i), "type": "n", "in": 4 * len(ids), "out": 1, "hash_ids": ids}
        for i, ids in enumerate(ids_per_turn)
    ]
    path.write_text(json.dumps({"id": sid, "block_size": 4, "requests": reqs}))


def test_same_local_ids_in_two_claude_files_never_hit_each_other(tmp_path: Path) -> None:
    turns = [[1, 2], [1, 2, 3], [1, 2, 3, 4]]
    (tmp_path / "d").mkdir()
    write_claude(tmp_path / "d" / "trace_1.json", "trace_1", turns)
    write_claude(tmp_path / "d" / "trace_2.json", "trace_2", turns)
    both = load_claude_code(tmp_path / "d", session_gap=0.0)  # fully interleaved
    one = load_claude_code(tmp_path / "d", max_sessions=1)
    fac = make_factory("radix", 4, "lru")
    alone = replay(one, fac, None).hit_tokens
    assert alone == 8 + 12
    # Had the namespaces leaked, trace_2's first turn alone would already hit 8 tokens.
    assert replay(both, fac, None).hit_tokens == 2 * alone


def test_default_capacities_and_token_parsing() -> None:
    assert default_capacities(1_000_000, 64) == [20_000, 50_000, 100_000, 200_000, 400_000]
    assert default_capacities(100, 64) == [64]
    assert parse_tokens("64k") == 64_000 and parse_tokens("1.5M") == 1_500_000
    assert parse_tokens("4096") == 4096
    with pytest.raises(argparse.ArgumentTypeError):
        parse_tokens("0")


def test_replay_command_writes_table_json_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": i * 10, "input_length": 512 * len(ids) - 7 * (i % 2), "hash_ids": ids}
        for i, ids in enumerate([[0], [0, 1], [0, 1, 2], [3], [0, 1, 4], [0, 1, 2]])
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    register(sub)
    helptext = " ".join(sub.choices["replay"].format_help().split())
    assert "512 Mooncake, 64 Claude Code" in helptext and "sequential" in helptext
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    argv = ["replay", str(trace), "--capacity-tokens", "1024", "4k", "--policy", "lru", "fifo"]
    args = parser.parse_args(
        [*argv, "--json", str(out_json), "--plot", str(out_png), "--no-progress"]
    )
    assert args.func(args) == 0
    table = capsys.readouterr().out
    assert "page 512" in table and "ideal" in table and "lru" in table
    doc = json.loads(out_json.read_text())
    rep = doc["traces"][0]
    assert rep["page_size"] == 512 and rep["summary"]["requests"] == 6
    assert [(r["capacity"], r["policy"]) for r in rep["results"]] == [
        (1024, "lru"),
        (1024, "fifo"),
        (4000, "lru"),
        (4000, "fifo"),
    ]
    # Page 512 floors every partial block away: hits are the repeated full blocks only.
    assert rep["ideal"]["hit_tokens"] == naive_ideal(load_mooncake(trace), 512)[0]
    assert out_png.stat().st_size > 1000


def test_smoke_real_mooncake_head(tmp_path: Path) -> None:
    head = tmp_path / "head.jsonl"
    with MOONCAKE_CONV.open() as fh:
        head.write_text("".join(next(fh) for _ in range(200)))
    trace = load_mooncake(head)
    assert len(trace) == 200 and trace[0].block_size == 512
    rep = replay_grid(str(head), trace, capacities=[200_000, 2_000_000], policies=["lru", "lfu"])
    # Independent ideal at page 512: leading run of full blocks already seen (chained ids).
    seen: set[int] = set()
    expect = 0
    for r in trace:
        full = r.hash_ids[: r.input_length // 512].tolist()
        run = next((i for i, h in enumerate(full) if h not in seen), len(full))
        expect += 512 * run
        seen.update(full)
    assert rep.ideal.hit_tokens == expect > 0
    for res in rep.results:
        assert 0 < res.hit_tokens <= rep.ideal.hit_tokens
        assert res.final_size <= (res.capacity or 0)


def test_blockhash_command_defaults_to_lru(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": i, "input_length": 512 * (i + 1), "hash_ids": list(range(i + 1))}
        for i in range(4)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    out = tmp_path / "r.json"
    argv = ["replay", str(trace), "--cache", "blockhash", "--page-size", "256", "--json", str(out)]
    args = parser.parse_args([*argv, "--capacity-tokens", "1024", "--no-progress"])
    assert args.func(args) == 0
    rep = json.loads(out.read_text())["traces"][0]
    assert rep["cache"] == "blockhash" and rep["page_size"] == 256
    assert [r["policy"] for r in rep["results"]] == ["lru"]
    # Each request extends the previous one: the ideal hits 512 * (0 + 1 + 2 + 3) tokens.
    assert rep["ideal"]["hit_tokens"] == 3072


def test_belady_oracle_bounds_every_policy_and_all_runs_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--policy all`: every online policy plus the oracle, marked as such, never beaten; the
    JSON carries every figure including the gap each policy closes."""
    trace = nested_workload(seed=3, sessions=5, turns=8)
    rep = replay_grid("t", trace, page_size=4, capacities=[16, 48], policies=POLICIES)
    for cap in (16, 48):
        runs = {r.policy: r for r in rep.results if r.capacity == cap}
        assert set(runs) == set(POLICIES) and runs["belady"].oracle
        best = runs["belady"].hit_tokens
        assert all(r.hit_tokens <= best for r in runs.values())
        assert best <= rep.ideal.hit_tokens
        if best > runs["lru"].hit_tokens:
            assert runs["lru"].gap_closed == 0.0
    path = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": i, "input_length": 512 * len(r.hash_ids), "hash_ids": r.hash_ids.tolist()}
        for i, r in enumerate(trace)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    out = tmp_path / "r.json"
    args = parser.parse_args(
        ["replay", str(path), "--policy", "all", "--capacity-tokens", "8k", "--json", str(out)]
    )
    assert args.func(args) == 0
    assert "belady *" in capsys.readouterr().out
    doc = json.loads(out.read_text())["traces"][0]["results"]
    assert {r["policy"] for r in doc} == set(POLICIES)
    assert [r["oracle"] for r in doc if r["policy"] == "belady"] == [True]
    assert all("gap_closed" in r and "token_hit_rate" in r for r in doc)


@pytest.mark.parametrize("seed", range(4))
def test_radix_keeps_at_least_what_blockhash_keeps(seed: int) -> None:
    """Page-granular tail-first eviction: at every capacity the radix tree (lru) hits at least
    as many tokens as the block-hash cache (lru) on nested conversations."""
    trace = nested_workload(seed=seed, sessions=6, turns=10)
    for cap in range(8, 400, 8):
        radix = replay(trace, make_factory("radix", 4, "lru"), cap).hit_tokens
        block = replay(trace, make_factory("blockhash", 4, "lru"), cap).hit_tokens
        assert radix >= block, cap


@pytest.mark.skipif(not MOONCAKE_CONV.exists(), reason="shared traces not present")
def test_radix_keeps_at_least_what_blockhash_keeps_on_a_real_slice(tmp_path: Path) -> None:
    head = tmp_path / "head.jsonl"
    with MOONCAKE_CONV.open() as fh:
        head.write_text("".join(next(fh) for _ in range(800)))
    trace = load_mooncake(head)
    for cap in (500_000, 1_000_000, 2_000_000):
        radix = replay(trace, make_factory("radix", 512, "lru"), cap).hit_tokens
        block = replay(trace, make_factory("blockhash", 512, "lru"), cap).hit_tokens
        assert radix >= block, cap


def test_session_aware_replay_closes_every_session() -> None:
    trace = nested_workload(seed=2, sessions=4, turns=6)
    for i, r in enumerate(trace):
        r.session = f"s{r.hash_ids[1] % 4 if len(r.hash_ids) > 1 else 0}-{i // 12}"
    res = replay(trace, make_factory("radix", 4, "session-lru"), 40, policy="session-lru")
    assert res.sessions_closed == len({r.session for r in trace})
    assert res.hit_tokens > 0

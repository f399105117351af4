"""Workload generators: token counts, prefix structure, reproducibility, ideal hit rate.

The ideal hit rate is recomputed here by a naive scan (longest common prefix with any earlier
prompt, element by element), independent of the compressed trie the package uses.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.bench.inputs import workloads as wl
from radixkv.bench.inputs.tokens import id_source, text_source
from radixkv.bench.inputs.workload_trace import trace_workload

TOKENS = id_source(id_range=(1000, 30000))


def lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def naive_hits(prompts: list[list[int]]) -> list[int]:
    return [max((lcp(p, q) for q in prompts[:i]), default=0) for i, p in enumerate(prompts)]


def naive_rate(w: wl.Workload) -> float:
    prompts = [r.prompt_ids for r in w.requests]
    return sum(naive_hits(prompts)) / sum(len(p) for p in prompts)


def check_common(w: wl.Workload) -> None:
    assert [r.index for r in w.requests] == list(range(len(w.requests)))
    for r in w.requests:
        assert all(1000 <= t < 30000 for t in r.prompt_ids)
        if r.parent is not None:
            parent = w.requests[r.parent]
            assert r.parent < r.index and parent.group == r.group
            # closed loop: the child's context contains the parent's whole prompt
            assert r.prompt_ids[: len(parent.prompt_ids)] == parent.prompt_ids
    assert w.ideal_hit_rate() == pytest.approx(naive_rate(w), abs=1e-12)


@given(st.lists(st.lists(st.integers(0, 3), max_size=12), max_size=12))
@settings(max_examples=200, deadline=None)
def test_ideal_hits_matches_naive_scan(prompts: list[list[int]]) -> None:
    assert wl.ideal_hits(prompts) == naive_hits(prompts)


def test_shared_prefix_structure_and_counts() -> None:
    g, p, s, q, o = 5, 4, 40, 7, 3
    w = wl.shared_prefix(
        TOKENS,
        num_groups=g,
        prompts_per_group=p,
        system_len=s,
        question_len=q,
        output_len=o,
        seed=3,
    )
    check_common(w)
    assert len(w.requests) == g * p
    assert all(len(r.prompt_ids) == s + q and r.max_tokens == o for r in w.requests)
    by_group: dict[str, list[list[int]]] = {}
    for r in w.requests:
        by_group.setdefault(r.group, []).append(r.prompt_ids)
    assert len(by_group) == g and all(len(v) == p for v in by_group.values())
    systems = {tuple(v[0][:s]) for v in by_group.values()}
    assert len(systems) == g  # a distinct system prompt per group ...
    for v in by_group.values():  # ... shared by all of its prompts, questions distinct
        assert all(x[:s] == v[0][:s] for x in v)
        assert len({tuple(x[s:]) for x in v}) == p
    # shuffled: groups interleave rather than arriving as contiguous blocks
    assert [r.group for r in w.requests] != sorted(
        (r.group for r in w.requests), key=lambda x: int(x[1:])
    )
    analytic = g * (p - 1) * s / (g * p * (s + q))
    assert naive_rate(w) == pytest.approx(analytic, abs=0.01)


def test_generators_are_seeded() -> None:
    def ids(seed: int) -> list[list[int]]:
        w = wl.multi_turn(TOKENS, num_conversations=2, num_turns=3, question_len=5, seed=seed)
        return [r.prompt_ids for r in w.requests]

    assert ids(7) == ids(7)
    assert ids(7) != ids(8)


def test_multi_turn_resends_history() -> None:
    c, t, sys_len, q, o = 3, 4, 6, 5, 4
    w = wl.multi_turn(
        TOKENS, num_conversations=c, num_turns=t, system_len=sys_len, question_len=q, output_len=o
    )
    check_common(w)
    assert len(w.requests) == c * t
    for i, r in enumerate(w.requests):
        turn = i // c
        assert len(r.prompt_ids) == sys_len + (turn + 1) * q + turn * o
        assert (r.parent is None) == (turn == 0)
        if r.parent is not None:  # history = parent prompt + an o-token answer, then the question
            assert len(r.prompt_ids) - len(w.requests[r.parent].prompt_ids) == o + q
    # turn k hits exactly its previous turn's prompt
    hits = naive_hits([r.prompt_ids for r in w.requests])
    for r, h in zip(w.requests, hits, strict=True):
        if r.parent is not None:
            assert h >= len(w.requests[r.parent].prompt_ids)


def test_tree_of_thought_branches() -> None:
    trees, root, b, d, q, o = 2, 30, 3, 2, 4, 5
    w = wl.tree_of_thought(
        TOKENS, num_trees=trees, root_len=root, branches=b, depth=d, question_len=q, output_len=o
    )
    check_common(w)
    assert len(w.requests) == trees * sum(b**k for k in range(d + 1))
    children: dict[int, int] = {}
    for r in w.requests:
        if r.parent is None:
            assert len(r.prompt_ids) == root
        else:
            children[r.parent] = children.get(r.parent, 0) + 1
            assert len(r.prompt_ids) == len(w.requests[r.parent].prompt_ids) + o + q
    assert sorted(set(children.values())) == [b]
    assert len(children) == trees * sum(b**k for k in range(d))  # every inner node expands


def test_agent_shares_tools_and_system() -> None:
    a, k, tools, sys_len, q, obs, o = 3, 4, 20, 10, 6, 8, 3
    w = wl.agent(
        TOKENS,
        num_sessions=a,
        num_steps=k,
        tools_len=tools,
        system_len=sys_len,
        question_len=q,
        observation_len=obs,
        output_len=o,
    )
    check_common(w)
    assert len(w.requests) == a * k
    pre = w.requests[0].prompt_ids[: tools + sys_len]
    assert all(r.prompt_ids[: tools + sys_len] == pre for r in w.requests)
    for i, r in enumerate(w.requests):
        step = i // a
        assert len(r.prompt_ids) == tools + sys_len + q + step * (o + obs)
    first_steps = [r.prompt_ids for r in w.requests[:a]]
    assert len({tuple(p[tools + sys_len :]) for p in first_steps}) == a


def _write_mooncake(path: Path) -> None:
    rows = [
        {"timestamp": 1000, "input_length": 1100, "output_length": 40, "hash_ids": [0, 1, 2]},
        {"timestamp": 3000, "input_length": 1024, "output_length": 8, "hash_ids": [0, 1]},
        {"timestamp": 4000, "input_length": 600, "output_length": 8, "hash_ids": [0, 5]},
        {"timestamp": 9000, "input_length": 300, "output_length": 8, "hash_ids": [7]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_trace_replay_scales_lengths_and_times(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    _write_mooncake(path)
    w = trace_workload(TOKENS, trace=str(path), length_scale=16, time_scale=0.5)
    check_common(w)
    # 512-token blocks become 32-token blocks; partial last blocks stay proportionally partial
    assert [len(r.prompt_ids) for r in w.requests] == [
        2 * 32 + math.ceil(76 * 32 / 512),
        64,
        32 + math.ceil(88 * 32 / 512),
        math.ceil(300 * 32 / 512),
    ]
    assert [r.arrival_s for r in w.requests] == [0.0, 1.0, 1.5, 4.0]
    assert [r.max_tokens for r in w.requests] == [3, 1, 1, 1]
    p = [r.prompt_ids for r in w.requests]
    assert lcp(p[0], p[1]) == 64 and lcp(p[0], p[2]) == 32 and lcp(p[0], p[3]) == 0
    assert naive_hits(p) == [0, 64, 32, 0]


def test_text_mode_round_trips_through_the_tokenizer() -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    words = ["".join(chr(97 + (i * 7 + j * 3) % 26) for j in range(2 + i % 6)) for i in range(400)]
    corpus = [" " + " ".join(words[i : i + 20]) for i in range(0, 400, 5)] * 5
    trainer = trainers.BpeTrainer(
        vocab_size=1500,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    src = text_source(tok)
    assert len(src.pool) >= 50
    special = tok.token_to_id("<|endoftext|>")
    assert special not in set(src.pool.tolist())
    w = wl.shared_prefix(src, num_groups=3, prompts_per_group=3, system_len=50, question_len=9)
    for r in w.requests:
        assert src.encode(src.to_text(r.prompt_ids)) == r.prompt_ids


def test_trace_replay_truncates_to_max_prompt_len(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    _write_mooncake(path)
    full = trace_workload(TOKENS, trace=str(path), length_scale=16)
    cut = trace_workload(TOKENS, trace=str(path), length_scale=16, max_prompt_len=40)
    for a, b in zip(full.requests, cut.requests, strict=True):
        assert b.prompt_ids == a.prompt_ids[:40]
    assert naive_hits([r.prompt_ids for r in cut.requests]) == [0, 40, 32, 0]


def test_trace_replay_puts_a_shared_tool_list_in_front(
    tmp_path: Path, default_model_dir: Path
) -> None:
    from radixkv.bench.inputs.tokens import id_source, load_tokenizer

    path = tmp_path / "t.jsonl"
    _write_mooncake(path)
    full = trace_workload(TOKENS, trace=str(path), length_scale=16)
    tok = id_source(load_tokenizer(default_model_dir))
    for source in (TOKENS, tok):
        w = trace_workload(source, trace=str(path), length_scale=16, tools_len=300)
        tools = w.requests[0].prompt_ids[:300]
        assert w.params["tools_len"] == 300
        for a, b in zip(full.requests, w.requests, strict=True):
            assert b.prompt_ids[:300] == tools and len(b.prompt_ids) == 300 + len(a.prompt_ids)
        # every request now shares the tool list beyond what the trace shared
        assert naive_hits([r.prompt_ids for r in w.requests]) == [0, 364, 332, 300]
    text = tok.tokenizer.decode(w.requests[0].prompt_ids[:300])
    assert text.startswith('{"type": "function", "function": {"name": "mcp__')
    cut = trace_workload(
        TOKENS, trace=str(path), length_scale=16, tools_len=300, max_prompt_len=320
    )
    assert max(len(r.prompt_ids) for r in cut.requests) == 320

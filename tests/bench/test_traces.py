"""Trace loaders: Mooncake jsonl and Claude Code sessions (archive, directory, single file)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from radixkv.bench.inputs.traces import (
    detect_format,
    load_claude_code,
    load_mooncake,
    load_trace,
    trace_summary,
)

MOONCAKE_ROWS = [
    # 3 blocks of 4 tokens, the last partial (10 = 4 + 4 + 2).
    {"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0, 1, 2]},
    {"timestamp": 1500, "input_length": 8, "output_length": 1, "hash_ids": [0, 1]},
    {"timestamp": 1500, "input_length": 5, "output_length": 2, "hash_ids": [0, 3]},
]


def write_mooncake(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def claude_doc(sid: str, requests: list[dict[str, Any]], block_size: int = 4) -> dict[str, Any]:
    return {"id": sid, "block_size": block_size, "hash_id_scope": "local", "requests": requests}


def creq(t: float, n_in: int, ids: list[int], kind: str = "n") -> dict[str, Any]:
    return {"t": t, "type": kind, "model": "m", "in": n_in, "out": 3, "hash_ids": ids}


# Session A: two parent turns and a subagent (started at t=5) whose turns reuse parent ids 1, 2.
SESSION_A = claude_doc(
    "trace_a",
    [
        creq(0.0, 9, [1, 2]),  # 2 full blocks + 1 unhashed token (the tail)
        {
            "t": 5.0,
            "type": "subagent",
            "requests": [creq(0.0, 8, [1, 2]), creq(2.5, 12, [1, 2, 7])],
        },
        creq(6.0, 12, [1, 2, 3]),
    ],
)
# Session B: the same local ids as A; they must not meet A's blocks.
SESSION_B = claude_doc("trace_b", [creq(0.0, 8, [1, 2]), creq(1.0, 8, [1, 2])])


def write_claude_dir(root: Path) -> Path:
    root.mkdir()
    for doc in (SESSION_B, SESSION_A):  # written out of order: the loader sorts by id
        (root / f"{doc['id']}.json").write_text(json.dumps(doc, indent=1))
    return root


def write_claude_tar(path: Path) -> Path:
    with tarfile.open(path, "w:xz") as tf:
        for doc in (SESSION_B, SESSION_A):
            data = json.dumps(doc).encode()
            info = tarfile.TarInfo(f"traces/{doc['id']}.json")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def test_mooncake_fields_and_partial_block(tmp_path: Path) -> None:
    reqs = load_mooncake(write_mooncake(tmp_path / "t.jsonl", MOONCAKE_ROWS), block_size=4)
    assert [r.arrival_s for r in reqs] == [0.0, 1.5, 1.5]
    assert [r.input_length for r in reqs] == [10, 8, 5]
    assert [r.output_length for r in reqs] == [5, 1, 2]
    assert reqs[0].hash_ids.tolist() == [0, 1, 2]
    assert reqs[0].tail_id == -1 and reqs[0].hashed_length == 10
    # Block b covers tokens b*4 .. b*4+3; the partial last block keeps its leading tokens.
    assert reqs[0].token_ids().tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert reqs[2].token_ids().tolist() == [0, 1, 2, 3, 12]
    assert trace_summary(reqs)["blocks"] == 7


def test_mooncake_rejects_inconsistent_block_counts(tmp_path: Path) -> None:
    too_many = {"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [0, 1]}
    with pytest.raises(ValueError, match="block ids"):
        load_mooncake(write_mooncake(tmp_path / "a.jsonl", [too_many]), block_size=4)
    too_few = {"timestamp": 0, "input_length": 9, "output_length": 1, "hash_ids": [0, 1]}
    with pytest.raises(ValueError, match="block ids"):
        load_mooncake(write_mooncake(tmp_path / "b.jsonl", [too_few]), block_size=4)


def test_detect_format(tmp_path: Path) -> None:
    assert detect_format(write_mooncake(tmp_path / "t.jsonl", MOONCAKE_ROWS)) == "mooncake"
    assert detect_format(write_claude_dir(tmp_path / "d")) == "claude-code"
    assert detect_format(write_claude_tar(tmp_path / "c.tar.xz")) == "claude-code"
    assert detect_format(tmp_path / "d" / "trace_a.json") == "claude-code"
    (tmp_path / "junk.txt").write_text("hello\n")
    with pytest.raises(ValueError):
        detect_format(tmp_path / "junk.txt")


def test_claude_code_namespacing_subagents_and_times(tmp_path: Path) -> None:
    reqs = load_claude_code(write_claude_dir(tmp_path / "d"), session_gap=100.0)
    assert len(reqs) == 6
    a = [r for r in reqs if r.session == "trace_a"]
    b = [r for r in reqs if r.session == "trace_b"]
    # trace_a sorts first: starts at 0; trace_b at 100. Subagent turns at 5 + 0 and 5 + 2.5.
    assert [r.arrival_s for r in a] == [0.0, 5.0, 6.0, 7.5]
    assert [r.arrival_s for r in b] == [100.0, 101.0]
    assert [r.arrival_s for r in reqs] == sorted(r.arrival_s for r in reqs)
    # The subagent shares its parent's namespace: local id 1 maps to one global id in trace_a.
    a_first = {int(r.hash_ids[0]) for r in a}
    b_first = {int(r.hash_ids[0]) for r in b}
    assert len(a_first) == 1 and len(b_first) == 1 and a_first != b_first
    ids_a = set(np.concatenate([r.hash_ids for r in a]).tolist())
    ids_b = set(np.concatenate([r.hash_ids for r in b]).tolist())
    assert not ids_a & ids_b
    toks_a = set(np.concatenate([r.token_ids() for r in a]).tolist())
    toks_b = set(np.concatenate([r.token_ids() for r in b]).tolist())
    assert not toks_a & toks_b


def test_claude_code_unhashed_tail_is_unique(tmp_path: Path) -> None:
    reqs = load_claude_code(write_claude_dir(tmp_path / "d"))
    first = reqs[0]
    assert first.input_length == 9 and first.num_blocks == 2 and first.hashed_length == 8
    assert first.tail_id >= 0 and first.num_tail_blocks == 1
    toks = first.token_ids()
    assert len(toks) == 9
    others = set(np.concatenate([r.token_ids() for r in reqs[1:]]).tolist())
    assert int(toks[-1]) not in others
    assert all(r.tail_id == -1 for r in reqs[1:])


def test_claude_code_archive_equals_directory(tmp_path: Path) -> None:
    from_dir = load_trace(write_claude_dir(tmp_path / "d"))
    from_tar = load_trace(write_claude_tar(tmp_path / "c.tar.xz"))
    assert len(from_dir) == len(from_tar)
    for x, y in zip(from_dir, from_tar, strict=True):
        assert (x.session, x.arrival_s, x.input_length) == (y.session, y.arrival_s, y.input_length)
        assert np.array_equal(x.token_ids(), y.token_ids())


def test_claude_code_single_file_and_sequential_sessions(tmp_path: Path) -> None:
    write_claude_dir(tmp_path / "d")
    single = load_trace(tmp_path / "d" / "trace_b.json")
    assert [r.arrival_s for r in single] == [0.0, 1.0]
    seq = load_claude_code(tmp_path / "d", session_gap=None)
    # Sequential: trace_b starts where trace_a's last request (t = 7.5) arrived.
    assert [r.arrival_s for r in seq if r.session == "trace_b"] == [7.5, 8.5]
    assert [r.session for r in seq] == ["trace_a"] * 4 + ["trace_b"] * 2
    assert len(load_claude_code(tmp_path / "d", max_sessions=1)) == 4


def test_token_ids_with_vocab_are_bounded_and_deterministic(tmp_path: Path) -> None:
    reqs = load_mooncake(write_mooncake(tmp_path / "t.jsonl", MOONCAKE_ROWS), block_size=4)
    toks = reqs[0].token_ids(vocab_size=1000)
    assert toks.dtype == np.int64 and len(toks) == 10
    assert toks.min() >= 0 and toks.max() < 1000
    assert np.array_equal(toks, reqs[0].token_ids(vocab_size=1000))
    # Shared blocks keep equal tokens, different blocks differ (the prefix structure survives).
    assert np.array_equal(toks[:8], reqs[1].token_ids(vocab_size=1000))
    assert not np.array_equal(toks[4:5], reqs[2].token_ids(vocab_size=1000)[4:5])

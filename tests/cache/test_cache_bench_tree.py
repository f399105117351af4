"""The tree benchmark runs end to end on a tiny workload (figures are not asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from radixkv.bench.tree import OPS, main, run_workload
from radixkv.cli import build_parser


def test_run_workload_small() -> None:
    for kind, page in (("radix", 1), ("radix", 16), ("blockhash", 16)):
        ops = run_workload(kind, page, num_seqs=20, seq_len=96, prefix_len=48, evict_tokens=40)
        assert set(ops) == set(OPS)
        assert ops["match"]["count"] == ops["full_hit_match"]["count"] == 20
        assert ops["evict"]["count"] >= 1
        assert all(s["mean_us"] >= 0 for s in ops.values())


def test_run_workload_hybrid_trees() -> None:
    """Each hybrid tree answers every full-hit match at the whole (page-floored) sequence and
    gives back every FULL slot on eviction (run_workload asserts both)."""
    for kind in ("full+swa", "full+state"):
        for page in (1, 4):
            ops = run_workload(
                kind, page, num_seqs=12, seq_len=90, prefix_len=41, evict_tokens=30, window=16
            )
            assert ops["full_hit_match"]["count"] == 12 and ops["evict"]["count"] >= 1


def test_cli_writes_json(tmp_path: Path, capsys: object) -> None:
    out = tmp_path / "tree.json"
    argv = ["--num-seqs", "10", "--seq-len", "64", "--prefix-len", "32", "--input", "list"]
    assert main([*argv, "--clock", "wall", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert {(r["cache"], r["page_size"]) for r in data["results"]} == {
        ("radix", 1),
        ("radix", 16),
        ("blockhash", 16),
    }
    args = build_parser().parse_args(["bench", "tree", "--num-seqs", "5"])
    assert args.func is not None and args.num_seqs == 5

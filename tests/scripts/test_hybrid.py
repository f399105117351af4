"""`scripts/hybrid.py` on the toy hybrid model: both modes run, the tree hits, and a running
request's SWA bytes stay below what full KV in the SWA layers would take."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from engine_toy_hybrid import ToyHybridConfig, ToyHybridLM

from scripts.hybrid import parser, run_lm, sizes_table, table


def test_bench_hybrid_runs_both_modes_on_a_toy() -> None:
    lm = ToyHybridLM(ToyHybridConfig(kinds=("full", "swa", "state", "swa"), window=8))
    args = parser().parse_args(
        [
            "--conversations",
            "2",
            "--turns",
            "3",
            "--system-len",
            "40",
            "--question-len",
            "20",
            "--output-len",
            "4",
            "--page-size",
            "4",
            "--chunk",
            "32",
            "--interval",
            "16",
            "--concurrency",
            "2",
            "--num-slots",
            "2048",
        ]
    )
    result = run_lm(lm, args)
    off, radix = result["modes"]["off"], result["modes"]["radix"]
    assert off["token_hit_rate"] == 0 and radix["token_hit_rate"] > 0
    assert radix["token_hit_rate"] <= radix["ideal_hit_rate"]
    assert radix["mean_swa_kv_bytes"] > 0
    held_full_kv = radix["mean_bytes_if_swa_kept_full_kv"]
    assert radix["mean_bytes_held"] < held_full_kv
    assert "radix" in table(result)


def test_sizes_table_shows_the_demand_sized_swa_pool() -> None:
    from radixkv.memory.hybrid import FULL, SWA, KVGroupSpec, PoolSpec

    gemma = PoolSpec({FULL: KVGroupSpec(3, 1, 256), SWA: KVGroupSpec(15, 1, 256, window=512)})
    text = sizes_table(gemma)  # Gemma 3 270M's shape
    rows = {line[:40].split()[0] + " " + line[10:38].strip(): line for line in text.splitlines()}
    assert rows["bfloat16 defaults"].split()[-1] == "2.12x"  # FULL grows by what SWA leaves
    assert rows["float32 defaults"].split()[-1] == "1.00x"  # demand above the even split

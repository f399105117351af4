"""`radixkv bench storage` end to end on small sizes: every store it starts itself answers with a
full fetch; the table and the JSON carry the figures; a store that cannot start is reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tier_services import mooncake_missing

from radixkv.cli import main


def test_bench_storage_fetch_cost(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stores = "file,redis,redis-cluster" + ("" if mooncake_missing() else ",mooncake")
    out = tmp_path / "storage.json"
    argv = ["bench", "storage", "--skip-replica", "--stores", stores, "--pages", "40"]
    assert main([*argv, "--page-bytes", "4096", "--repeats", "2", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert list(res["stores"]) == stores.split(",")
    for name, r in res["stores"].items():
        assert "error" not in r, (name, r)
        f = r["fetch"]
        assert f["fetch_us_per_page"] > 0 and len(f["fetch_runs_s"]) == 2
        assert f["round_trips_per_fetch"] == 2  # 40 keys in batches of 32
    table = capsys.readouterr().out
    assert "redis-cluster" in table and "fetch us/page" in table


def test_bench_storage_reports_a_store_it_cannot_reach(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "storage", "--skip-replica", "--stores", "redis", "--pages", "4"]
    assert main([*argv, "--redis-url", "redis://127.0.0.1:1/0", "--repeats", "1"]) == 0
    assert "redis          not run: RuntimeError: 4 writes failed" in capsys.readouterr().out

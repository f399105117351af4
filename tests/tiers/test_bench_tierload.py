"""`radixkv bench tierload` on small sizes: it reports every phase and the JSON carries the
figures; a load path that copies the wrong bytes fails the bench instead of timing it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixkv.cli import main
from radixkv.memory.host_pool import HostKVPool

SMALL = ["--pages", "12", "--repeats", "2", "--layers", "2", "--page-size", "4"]


def test_bench_tierload_reports_each_phase(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tierload.json"
    assert main(["bench", "tierload", *SMALL, "--threads", "1", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["pages"] == 12 and res["tokens"] == 48 and len(res["runs"]) == 2
    assert res["page_bytes"] == 2 * 2 * 4 * 3 * 64 * 2  # layers x K/V x page x heads x dim x bf16
    assert set(res["ms"]) == {"fetch", "land", "l1_copy"} and res["tokens_per_s"] > 0
    assert "L1 copy ms" in capsys.readouterr().out


def test_bench_tierload_fails_on_wrong_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    original = HostKVPool.load

    def off_by_one(self: HostKVPool, host_pages: list[int], device_pages: list[int]) -> None:
        original(self, host_pages, [d + 1 for d in device_pages])  # each page one page late

    monkeypatch.setattr(HostKVPool, "load", off_by_one)
    with pytest.raises(RuntimeError, match="loaded KV differs"):
        main(["bench", "tierload", *SMALL])

"""The traces shipped in data/traces: intact (SHA256SUMS), documented, found by name from any
working directory, and named repository-relative in every report."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from radixkv.bench.inputs import traces
from radixkv.bench.inputs.tokens import TokenSource
from radixkv.bench.inputs.trace_files import (
    NAMED_TRACES,
    REPO_ROOT,
    display_command,
    display_path,
    resolve_trace,
    traces_dir,
)
from radixkv.bench.inputs.traces import TraceRequest, load_trace
from radixkv.bench.inputs.workload_trace import trace_workload
from radixkv.bench.replay_cli import register

DATA = REPO_ROOT / "data" / "traces"
CHECKOUT = Path(__file__).resolve().parents[2]


def test_repo_root_is_the_checkout_the_package_runs_from() -> None:
    """REPO_ROOT counts parents from its own module: moving the module must move the count."""
    from radixkv.bench.inputs import trace_files

    if not Path(trace_files.__file__).resolve().is_relative_to(CHECKOUT / "src"):
        pytest.skip("radixkv is installed, not run from this checkout")
    assert REPO_ROOT == CHECKOUT


def _sums() -> dict[str, str]:
    out = {}
    for line in (DATA / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        out[name.removeprefix("./")] = digest
    return out


def test_shipped_traces_match_their_checksums_and_readme() -> None:
    sums = _sums()
    assert len(sums) == 6
    readme = (DATA / "README.md").read_text()
    for name, digest in sums.items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name
        assert f"{digest}  {name}" in readme  # the README lists the same checksums
    for word in ("Licence", "Cite", "Source"):
        assert readme.count(word) >= 3


def test_named_traces_resolve_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RADIXKV_TRACES_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert traces_dir() == DATA
    for name, rel in NAMED_TRACES.items():
        assert resolve_trace(name) == DATA / rel
        assert resolve_trace(rel) == DATA / rel
        assert display_path(resolve_trace(name)) == f"data/traces/{rel}"
    # A report's own repository-relative path resolves back from elsewhere too.
    assert (
        resolve_trace("data/traces/" + NAMED_TRACES["mooncake"]) == DATA / NAMED_TRACES["mooncake"]
    )
    with pytest.raises(FileNotFoundError, match="short names: mooncake"):
        resolve_trace("no-such-trace")


def test_display_helpers_keep_outside_paths() -> None:
    inside = str(DATA / "mooncake-fast25" / "synthetic_trace.jsonl")
    assert display_path(inside) == "data/traces/mooncake-fast25/synthetic_trace.jsonl"
    assert display_path("/definitely/elsewhere.jsonl") == "/definitely/elsewhere.jsonl"
    cmd = display_command(["radixkv", "replay", inside, f"--json={REPO_ROOT}/out.json"])
    assert cmd == "radixkv replay data/traces/mooncake-fast25/synthetic_trace.jsonl --json=out.json"
    assert os.sep + "work" + os.sep not in cmd.replace("/definitely", "")


def test_replay_defaults_to_the_shipped_trace_and_prints_relative_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    out = tmp_path / "r.json"
    argv = ["replay", "--limit", "40", "--capacity-tokens", "50k", "--policy", "lru"]
    args = parser.parse_args([*argv, "--no-progress", "--json", str(out)])
    assert args.traces == ["mooncake"]
    assert args.func(args) == 0
    rel = "data/traces/mooncake-fast25/conversation_trace.jsonl"
    assert capsys.readouterr().out.startswith(rel + ": 40 requests")
    doc = json.loads(out.read_text())
    assert doc["traces"][0]["path"] == rel
    assert str(REPO_ROOT) not in out.read_text()


def test_trace_workload_defaults_to_claude_code(monkeypatch: pytest.MonkeyPatch) -> None:
    # Parsing the whole archive takes ~40 s on 2 busy cores: read the first 3 requests of the
    # Mooncake trace instead, and check which file the workload asked for.
    asked: list[Path] = []
    mooncake = load_trace(resolve_trace("mooncake"))[:3]

    def fake_load(path: Path, **_: object) -> list[TraceRequest]:
        asked.append(Path(path))
        return mooncake

    monkeypatch.setattr(traces, "load_trace", fake_load)
    wl = trace_workload(TokenSource(np.arange(1000, 1100)), length_scale=64)
    assert asked == [DATA / NAMED_TRACES["claude-code"]]
    assert wl.params["trace"] == "data/traces/" + NAMED_TRACES["claude-code"]
    assert len(wl.requests) == 3

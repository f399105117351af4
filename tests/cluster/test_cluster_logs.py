"""The launcher's log folder: a temporary folder of its own is removed after a clean stop and kept,
with a warning naming it, when something failed. Real replicas (one, tiny model, no router, so
each case starts in seconds); the temporary folders go under pytest's `tmp_path`."""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import tempfile
from pathlib import Path

import pytest
from cluster_harness import SERVE_ARGS, popen_ctrl_c, read_until_serving

from radixkv.cluster.launch import ClusterSpec, start_cluster


def _spec(model_dir: Path) -> ClusterSpec:
    return ClusterSpec(replicas=1, model=str(model_dir), serve_args=SERVE_ARGS, router="none")


def _log_dirs(root: Path) -> list[Path]:
    return sorted(root.glob("radixkv-cluster-*"))


@pytest.mark.slow
def test_cluster_up_removes_its_logs_after_ctrl_c(model_dir: Path, tmp_path: Path) -> None:
    """`radixkv cluster up` without --log-dir, stopped by Ctrl-C: nothing left in TMPDIR."""
    cmd = [sys.executable, "-m", "radixkv", "cluster", "up", "--replicas", "1", "--router", "none"]
    cmd += ["--model", str(model_dir), "--", *SERVE_ARGS]
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = popen_ctrl_c(cmd, env=env)
    try:
        (logs,) = re.findall(r"^  logs: (\S+)", read_until_serving(proc), re.M)
        assert _log_dirs(tmp_path) == [Path(logs)] and (Path(logs) / "replica0.log").exists()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0 and "stopped" in out, out
        assert _log_dirs(tmp_path) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


@pytest.mark.slow
def test_logs_kept_and_named_when_something_failed(
    model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    caplog.set_level(logging.WARNING, logger="radixkv.cluster.launch")

    # An exception inside the block: the folder stays, the exception names it.
    with pytest.raises(RuntimeError) as info, start_cluster(_spec(model_dir)) as cluster:
        first = cluster.log_dir
        raise RuntimeError("the benchmark failed")
    assert first.parent == tmp_path and (first / "replica0.log").exists()
    assert f"cluster logs kept in {first}" in getattr(info.value, "__notes__", [])
    assert str(first) in caplog.text

    # A replica that died on its own (not through kill_worker), the block left normally.
    caplog.clear()
    with start_cluster(_spec(model_dir)) as cluster:
        second = cluster.log_dir
        pid = cluster.workers[0].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        cluster.workers[0].proc.wait(30)  # type: ignore[union-attr]
    assert cluster.crashed == ["replica 0"] and (second / "replica0.log").exists()
    assert f"cluster logs kept in {second} (replica 0 exited on its own)" in caplog.text

    # A clean run right after: its own folder goes, the two kept ones stay.
    with start_cluster(_spec(model_dir)) as cluster:
        cluster.kill_worker(0)  # a fault drill is no failure
        cluster.restart_worker(0)
        third = cluster.log_dir
    assert not third.exists() and _log_dirs(tmp_path) == sorted([first, second])

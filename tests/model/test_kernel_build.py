"""Where the C++ kernels build: a folder per source version, and a build killed mid-way delays the
next process by nothing (real processes; torch's builder replaced by one that keeps its lock
protocol, `FileBaton` on `lock`, so no compiler runs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from radixkv.model import kernels

SRC = Path(__file__).resolve().parents[2] / "src"

# A process that loads the kernels through `cpu_kernels()` with torch's `load` replaced: as torch
# does, it creates the baton `lock` in the build folder while it "builds" (forever with `hang`)
# and otherwise waits for as long as that file exists.
CHILD = """
import os, sys, time
import torch.utils.cpp_extension as ext
from torch.utils.file_baton import FileBaton
from radixkv.model import kernels

def load(name, sources, extra_cflags, build_directory, verbose):
    baton = FileBaton(os.path.join(build_directory, "lock"))
    if baton.try_acquire():
        try:
            print("building", flush=True)
            if sys.argv[1] == "hang":
                time.sleep(600)
        finally:
            baton.release()
    else:
        baton.wait()
    return Module()

class Module:  # what cpu_kernels() asks of a built module: its bfloat16 paths (none here)
    def bf16_gemm_paths(self):
        return []

    def __repr__(self):
        return "module"

ext.load = load
print("loaded", kernels.cpu_kernels(), flush=True)
"""


def _spawn(tmp_path: Path, mode: str) -> subprocess.Popen[str]:
    env = dict(os.environ, RADIXKV_CACHE_DIR=str(tmp_path / "models"), RADIXKV_CPU_KERNELS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, mode], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def test_build_folder_names_the_sources(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RADIXKV_CACHE_DIR", str(tmp_path / "models"))
    name = kernels.build_dir().name
    assert name.endswith(kernels._source_tag()) and kernels._cpu_tag() in name
    assert kernels.build_dir().parent == tmp_path / "kernels"


def test_a_killed_build_is_taken_over_at_once(tmp_path: Path) -> None:
    """A builder SIGKILLed mid-build leaves torch's `lock` file behind; a process that was
    waiting meanwhile takes over as soon as the builder is dead (not after a timeout), removes
    that file and loads."""
    first = _spawn(tmp_path, "hang")
    second: subprocess.Popen[str] | None = None
    try:
        assert first.stdout is not None and first.stdout.readline() == "building\n"
        second = _spawn(tmp_path, "build")
        time.sleep(4)  # it imported torch and waits for the builder
        assert second.poll() is None, second.communicate()[0]
        locks = list((tmp_path / "kernels").glob("*/lock"))
        assert len(locks) == 1  # torch's baton, held by the builder
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        started = time.monotonic()
        out, _ = second.communicate(timeout=30)
        assert second.returncode == 0 and out.splitlines()[-1] == "loaded module", out
        assert "building" in out  # it built itself, after removing the dead builder's lock
        print(f"taken over {time.monotonic() - started:.2f} s after the builder died")
        assert not locks[0].exists()
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)
            if p is not None and p.stdout is not None:
                p.stdout.close()


def test_the_lock_excludes_while_its_holder_lives(tmp_path: Path) -> None:
    """Two holders in one folder take turns; the lock file itself stays (the flock is on it)."""
    import threading

    order: list[str] = []
    with kernels.build_lock(tmp_path):
        t = threading.Thread(target=lambda: _hold(tmp_path, order))
        t.start()
        time.sleep(0.3)
        order.append("first done")
    t.join(10)
    assert order == ["first done", "second"]
    assert (tmp_path / kernels.LOCK_NAME).exists()


def _hold(path: Path, order: list[str]) -> None:
    with kernels.build_lock(path):
        order.append("second")

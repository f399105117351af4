"""Where the C++ kernels build: a folder per source version, and a lock left by a killed build
does not hang the next process."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from radixkv.model import kernels


def test_build_folder_names_the_sources(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RADIXKV_CACHE_DIR", str(tmp_path / "models"))
    name = kernels.build_dir().name
    assert name.endswith(kernels._source_tag()) and kernels._cpu_tag() in name
    assert kernels.build_dir().parent == tmp_path / "kernels"


def test_a_stale_lock_is_removed_a_fresh_one_kept(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    lock.write_text("")
    kernels._clear_stale_lock(tmp_path)
    assert lock.exists()  # a build may be running
    old = time.time() - kernels.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    kernels._clear_stale_lock(tmp_path)
    assert not lock.exists()
    kernels._clear_stale_lock(tmp_path)  # no lock: nothing to do

"""Shared by the cluster tests: the routers' virtualenvs (a skip only when pip cannot reach the
package index), the replicas' common flags, and reading a replica's request counters."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixkv.cluster.routers import ROUTER_PACKAGES, RouterInstallError, cached_venv

KEY = "gw-test-key"
MODEL = "tiny-llama"
AUTH = {"Authorization": f"Bearer {KEY}"}
# Tiny model, small pool, one thread: a replica starts in a few seconds.
SERVE_ARGS = (
    "--served-model-name", MODEL, "--num-slots", "4096", "--max-model-len", "512",
    "--no-compile", "--threads", "1", "--log-level", "warning",
)  # fmt: skip


def router_python_or_skip(router: str) -> Path:
    """The router's cached virtualenv (installed on first use); skip only if pip is offline."""
    return venv_python_or_skip(ROUTER_PACKAGES[router])


def venv_python_or_skip(requirement: str) -> Path:
    """A cached virtualenv holding `requirement`; skip only if pip cannot reach the index."""
    try:
        return cached_venv(requirement)
    except RouterInstallError as exc:
        if exc.offline:
            pytest.skip(str(exc))
        pytest.fail(str(exc))


def requests_by_route(url: str) -> dict[tuple[str, str], float]:
    """A replica's `radixkv_http_requests_total` as {(route, status): count}."""
    text = httpx.get(url + "/metrics", headers=AUTH, timeout=10).text
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "radixkv_http_requests":
            continue
        for s in family.samples:
            if s.name.endswith("_total"):
                out[s.labels["route"], s.labels["status"]] = s.value
    return out


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def popen_ctrl_c(cmd: list[str], **kw: Any) -> subprocess.Popen[str]:
    """Start `cmd` (text output piped) so that SIGINT reaches it as a terminal's Ctrl-C does,
    even when this test run itself ignores SIGINT (a shell's background job, e.g. `cmd &`, starts
    with SIGINT ignored, children inherit that, and Python then installs no KeyboardInterrupt)."""
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=_default_sigint, **kw,
    )  # fmt: skip


def read_until_serving(proc: subprocess.Popen[str], timeout_s: float = 300) -> str:
    """`cluster up`'s output up to its "Serving ..." line (it is ready then); fails with the
    output so far if it exits or the time runs out first."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while not any(line.startswith("Serving") for line in lines):
        line = proc.stdout.readline()
        assert line, "".join(lines)  # it exited
        lines.append(line)
        assert time.monotonic() < deadline, "".join(lines)
    return "".join(lines)

"""`radixkv cluster up` as a user runs it: a real process that starts two replicas behind smg and
prints the router's URL; a request through that URL is answered; Ctrl-C (SIGINT to the command
alone, as a terminal sends it to the foreground process) stops every process it started."""

from __future__ import annotations

import re
import signal
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from cluster_harness import (
    KEY,
    MODEL,
    SERVE_ARGS,
    popen_ctrl_c,
    read_until_serving,
    router_python_or_skip,
)


def _refused(url: str) -> bool:
    """Whether nothing listens at `url` any more. A server caught mid-shutdown (it accepted the
    connection, then closed it unanswered) is still there: not refused yet."""
    try:
        httpx.get(url + "/health", timeout=2)
    except httpx.ConnectError:
        return True
    except httpx.RemoteProtocolError:
        return False
    return False


@pytest.mark.slow
def test_cluster_up_serves_then_stops_everything_on_ctrl_c(model_dir: Path, tmp_path: Path) -> None:
    smg = router_python_or_skip("smg")
    cmd = [sys.executable, "-m", "radixkv", "cluster", "up", "--replicas", "2"]
    cmd += ["--model", str(model_dir), "--api-key", KEY, "--router-python", str(smg)]
    cmd += ["--log-dir", str(tmp_path), "--", *SERVE_ARGS]
    proc = popen_ctrl_c(cmd)
    try:
        text = read_until_serving(proc)
        (router,) = re.findall(r"^smg \(cache_aware\) at (http://127\.0\.0\.1:\d+)/v1$", text, re.M)
        workers = re.findall(r"replica \d: (http://127\.0\.0\.1:\d+)", text)
        assert len(workers) == 2 and f"Serving '{MODEL}'" in text

        client = openai.OpenAI(base_url=router + "/v1", api_key=KEY, max_retries=0, timeout=120)
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello?"}], max_tokens=4
        )
        assert r.usage is not None and r.usage.completion_tokens >= 1

        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0, text + out
        assert "stopped" in out
        assert all(_refused(u) for u in [router, *workers])
        assert {p.name for p in tmp_path.iterdir()} >= {
            "replica0.log",
            "replica1.log",
            "router.log",
        }
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


@pytest.mark.slow
def test_cluster_up_killed_leaves_no_replica_running(model_dir: Path, tmp_path: Path) -> None:
    """`cluster up` SIGKILLed (nothing of it runs to stop its children, as with the OOM killer):
    the kernel sends each replica SIGTERM (PR_SET_PDEATHSIG), which stops it and its engine, so
    nothing is left holding the ports and the memory."""
    cmd = [sys.executable, "-m", "radixkv", "cluster", "up", "--replicas", "1", "--router", "none"]
    cmd += ["--model", str(model_dir), "--log-dir", str(tmp_path), "--", *SERVE_ARGS]
    proc = popen_ctrl_c(cmd)
    try:
        (worker,) = re.findall(r"replica \d: (http://127\.0\.0\.1:\d+)", read_until_serving(proc))
        assert not _refused(worker)
        proc.kill()
        proc.wait(30)
        deadline = time.monotonic() + 60
        while not _refused(worker):
            assert time.monotonic() < deadline, "the replica outlived its launcher"
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)

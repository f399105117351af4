"""Start and stop a peer engine's OpenAI-compatible server (e.g. vLLM) for side-by-side runs.

The peer runs from its own interpreter with an explicit environment; `describe()` returns the
exact command line and the environment variables we set, for the report.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from radixkv.bench.server_proc import free_port, healthy, home_relative


def vllm_env(num_cores: int) -> dict[str, str]:
    """vLLM CPU settings for a fair run: every core bound, none reserved (its CPU build keeps
    one of two cores for itself otherwise), loopback only, a 2 GiB KV cache space."""
    return {
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{num_cores - 1}" if num_cores > 1 else "0",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CPU_KVCACHE_SPACE": "2",
        # Lets the benchmark clients reset the prefix cache after their warm-up.
        "VLLM_SERVER_DEV_MODE": "1",
    }


class PeerServer:
    """`cmd + --host 127.0.0.1 --port P` with `env` added to ours; waits for /health on entry,
    always stops the whole process group on exit (SIGTERM, then SIGKILL)."""

    def __init__(
        self, cmd: list[str], env: dict[str, str], log_path: Path, startup_timeout: float
    ) -> None:
        self.port = free_port()
        self.cmd = [*cmd, "--host", "127.0.0.1", "--port", str(self.port)]
        self.env = env
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    def describe(self) -> dict[str, Any]:
        env = " ".join(f"{k}={v}" for k, v in self.env.items())
        return {
            "command": home_relative(f"{env} {shlex.join(self.cmd)}"),
            "env": dict(self.env),
            "startup_s": self.startup_s,
        }

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,  # its workers die with it (we signal the group)
            )
        while time.perf_counter() < t0 + self.startup_timeout:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"peer exited with {self.proc.returncode}; log tail:\n{tail}")
            if healthy(self.url):
                self.startup_s = time.perf_counter() - t0
                return
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"peer not healthy after {self.startup_timeout:.0f} s")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)

    def __enter__(self) -> PeerServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

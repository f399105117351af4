"""One child process of a cluster: its command line, its log file, and waiting on it.

Children start in sessions of their own (a Ctrl-C in the launcher's terminal reaches the
launcher alone, which then stops them in order), get SIGTERM if the launcher dies without
stopping them (SIGKILL, the OOM killer: on Linux, `die_with_parent`), and write stdout + stderr
to one log file, appended to across restarts so a restarted replica's earlier life stays
readable.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from radixkv.storage.local_services import die_with_parent


class ClusterError(RuntimeError):
    """A process of the cluster exited or did not become ready (the message ends with its log)."""


@dataclass
class Child:
    name: str
    cmd: list[str]
    log: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    stopping: bool = field(default=False, repr=False)  # its exit is ours (kill/terminate)

    def start(self) -> None:
        """Start the command (never two lives at once: a running one is stopped first)."""
        self.terminate()
        self.stopping = False
        with open(self.log, "ab") as out:  # the child keeps its own descriptor
            out.write(f"==== {self.name}: {' '.join(self.cmd)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self.cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                start_new_session=True, preexec_fn=die_with_parent(),
            )  # fmt: skip

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def crashed(self) -> bool:
        """It exited on its own (not by `kill`, `terminate` or `stop_all`)."""
        return self.proc is not None and self.proc.poll() is not None and not self.stopping

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def kill(self) -> None:
        """SIGKILL (a crash: no clean shutdown) and reap."""
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def terminate(self, grace_s: float = 30.0) -> None:
        """SIGTERM (a clean shutdown), then SIGKILL after `grace_s`."""
        self.stopping = True
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def wait_ready(self, ready: Callable[[], bool], timeout_s: float) -> None:
        """Poll `ready` (transport errors count as not yet) until true; raise ClusterError with
        the log's tail if the process exits or the time runs out."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive:
                code = None if self.proc is None else self.proc.returncode
                raise ClusterError(f"{self.name} exited ({code}):\n{self.tail()}")
            try:
                if ready():
                    return
            except (httpx.TransportError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise ClusterError(f"{self.name} not ready in {timeout_s:.0f}s:\n{self.tail()}")
            time.sleep(0.2)


def stop_all(children: Sequence[Child], grace_s: float = 30.0) -> None:
    """SIGTERM every live child at once, then wait for each (SIGKILL past `grace_s`)."""
    live = [c for c in children if c.alive]
    for c in live:
        assert c.proc is not None
        c.stopping = True
        c.proc.terminate()
    deadline = time.monotonic() + grace_s
    for c in live:
        assert c.proc is not None
        try:
            c.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.kill()

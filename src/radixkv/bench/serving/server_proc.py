"""Start and stop our own server (`python -m radixkv serve`) as a subprocess for benchmarks."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Self

# Server flags of each named configuration of `bench compare` (on top of --model/--host/--port).
# Page sizes are explicit so a column's description says what granularity its cache shares at:
# radix-p16 and blockhash differ only in the cache design, not in the page size.
CONFIGS: dict[str, tuple[str, ...]] = {
    "off": ("--disable-radix-cache", "--schedule-policy", "fcfs"),
    "radix": ("--eviction-policy", "lru", "--schedule-policy", "fcfs", "--page-size", "1"),
    "radix-lpm": ("--eviction-policy", "lru", "--schedule-policy", "lpm", "--page-size", "1"),
    "radix-p16": ("--eviction-policy", "lru", "--schedule-policy", "fcfs", "--page-size", "16"),
    "blockhash": ("--cache", "blockhash", "--schedule-policy", "fcfs", "--page-size", "16"),
}
CONFIG_HELP = {
    "off": "radix cache disabled (--disable-radix-cache), fcfs",
    "radix": "radix cache, page size 1 token, lru eviction, fcfs scheduling",
    "radix-lpm": "radix cache, page size 1 token, lru eviction, lpm (longest prefix first) "
    "scheduling",
    "radix-p16": "radix cache, page size 16 tokens (matched to blockhash), lru eviction, fcfs "
    "scheduling",
    "blockhash": "vLLM-style chained block-hash cache, page (block) size 16 tokens, fcfs",
}


def home_relative(text: str) -> str:
    """`text` with this user's home directory written as ~ (reports carry no machine paths)."""
    home = str(Path.home())
    return text.replace(home + "/", "~/") if home not in ("", "/") else text


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def get_json(url: str) -> dict[str, Any] | None:
    """GET a JSON object, best effort (None on any failure)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            obj = json.loads(r.read())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def served_kernel_paths(url: str) -> dict[str, str] | None:
    """The CPU model and kernel paths a running RadixKV server's engine took, as its `GET
    /config` reports them (`resolved.kernel_paths`, computed in the engine's process); None
    when the server does not say (another engine, an older RadixKV, a refused request)."""
    body = get_json(url.rstrip("/") + "/config")
    paths = (body or {}).get("resolved", {}).get("kernel_paths")
    return {str(k): str(v) for k, v in paths.items()} if isinstance(paths, dict) else None


def wait_healthy(
    url: str,
    proc: subprocess.Popen[Any],
    timeout_s: float,
    interval_s: float = 0.25,
    output: Callable[[], str] | None = None,
) -> str | None:
    """Poll `url`/health until it answers 200 while `proc` lives. Returns None once it does, else
    why not: the process exited (with `output()` when given), or `timeout_s` passed."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        if proc.poll() is not None:
            tail = output() if output is not None else ""
            return f"server exited with {proc.returncode}; {tail}".rstrip("; ")
        if healthy(url):
            return None
        time.sleep(interval_s)
    return f"server not healthy after {timeout_s:g} s"


class ServerProcess:
    """A server subprocess on a free loopback port; a context manager that waits for /health on
    entry and always stops the server's whole process group on exit (SIGTERM, then SIGKILL), so
    worker processes it started go too. Subclasses say which `command` to run; `env` is added
    to ours. stdout/stderr go to `log_path` so a failed start can be diagnosed.
    """

    def __init__(
        self,
        log_path: str | Path | None = None,
        startup_timeout: float = 600.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout = startup_timeout
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    @property
    def command(self) -> list[str]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """The command line with the environment variables we set, for reports."""
        prefix = " ".join(f"{k}={v}" for k, v in self.env.items())
        cmd = shlex.join(["python", *self.command[1:]])
        return {
            "command": home_relative(f"{prefix} {cmd}".strip()),
            "env": dict(self.env),
            "startup_s": self.startup_s,
        }

    def start(self) -> None:
        out: int | IO[bytes] = subprocess.DEVNULL
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            out = self.log_path.open("wb")
        t0 = time.perf_counter()
        try:
            self.proc = subprocess.Popen(
                self.command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,  # its own process group: stop() signals every worker
            )
        finally:
            if not isinstance(out, int):
                out.close()  # the child holds its own copy of the descriptor
        why = wait_healthy(self.url, self.proc, self.startup_timeout, output=self._log_tail)
        if why is None:
            self.startup_s = time.perf_counter() - t0
            return
        self.stop()
        raise RuntimeError(why)

    def _log_tail(self) -> str:
        if not self.log_path or not self.log_path.exists():
            return "no log"
        return "log tail:\n" + self.log_path.read_text(errors="replace")[-2000:]

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

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class LocalServer(ServerProcess):
    """`python -m radixkv serve` with `flags` (and `--model` unless None)."""

    def __init__(
        self,
        model: str | None,
        flags: tuple[str, ...] | list[str] = (),
        log_path: str | Path | None = None,
        startup_timeout: float = 600.0,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        threads = ("OMP_NUM_THREADS", "RADIXKV_THREADS")  # recorded: they change the result
        env = {k: os.environ[k] for k in threads if k in os.environ}
        super().__init__(log_path, startup_timeout, {**env, **(extra_env or {})})
        self.model = model
        self.flags = list(flags)

    @property
    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "radixkv", "serve", "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port)]
        if self.model:
            cmd += ["--model", self.model]
        return cmd + self.flags

"""Throwaway storage services on loopback for tests and `radixkv bench storage`.

`RedisClusterProcs` starts N `redis-server --cluster-enabled yes` processes on free ports in a
directory, joins them with `redis-cli --cluster create` (no replicas) and waits for
`cluster_state:ok`. `MooncakeProcs` starts a `mooncake_master` (with its embedded HTTP metadata
server) and one `mooncake_client` store service that contributes the memory, so the stored pages
outlive any engine. Both bind 127.0.0.1 only, write nothing outside their directory, and `stop()`
kills what they started. Not meant for production: no persistence, no replicas, no auth.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that has the child sent SIGTERM when the process starting it dies, even by
    SIGKILL or the OOM killer (Linux's PR_SET_PDEATHSIG), so a killed launcher leaves no service
    holding its ports and memory; None elsewhere. The signal follows the starting *thread*: start
    children from a thread that outlives them (the launchers use the main thread)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def arm() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return arm


def _exe(name: str, hint: str) -> str:
    """`name` on PATH or next to this Python (a virtualenv's bin/, where pip puts it)."""
    exe = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if exe is None:
        raise RuntimeError(f"{name} is not installed ({hint})")
    return exe


class ServiceDied(RuntimeError):
    """A process we started exited while we waited for it."""


def _wait(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Poll `check` until true; a ServiceDied from it ends the wait at once."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except ServiceDied:
            raise
        except Exception:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not come up within {timeout_s:.0f}s")


class RedisClusterProcs:
    """A Redis Cluster of `nodes` primaries (no replicas) on loopback; with `cluster=False`,
    `nodes` standalone servers instead (`url` names the first)."""

    def __init__(
        self, workdir: Path, nodes: int = 3, node_timeout_ms: int = 2000, cluster: bool = True
    ) -> None:
        self.cluster = cluster
        self.server = _exe("redis-server", "apt-get install redis-server")
        self.cli = _exe("redis-cli", "apt-get install redis-tools")
        self.workdir = Path(workdir)
        self.ports = [free_port() for _ in range(nodes)]
        self.bus_ports = {p: free_port() for p in self.ports}  # cluster bus (gossip)
        self.node_timeout_ms = node_timeout_ms
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        if not self.cluster:
            return f"redis://127.0.0.1:{self.ports[0]}/0"
        return "redis-cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def _start_node(self, port: int) -> None:
        d = self.workdir / f"node-{port}"
        d.mkdir(parents=True, exist_ok=True)
        args = [self.server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d)]
        args += ["--appendonly", "no", "--save", ""]
        if not self.cluster:
            self.procs[port] = subprocess.Popen(
                args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                preexec_fn=die_with_parent(),
            )  # fmt: skip
            return
        args += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"]
        args += ["--cluster-port", str(self.bus_ports[port])]
        args += ["--cluster-node-timeout", str(self.node_timeout_ms)]
        # A cache: the surviving nodes keep serving their slots when one node is gone.
        args += ["--cluster-require-full-coverage", "no"]
        self.procs[port] = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent(),
        )  # fmt: skip

    def _cli(self, port: int, *args: str) -> str:
        out = subprocess.run(
            [self.cli, "-h", "127.0.0.1", "-p", str(port), *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode != 0:
            raise RuntimeError(f"redis-cli {' '.join(args)}: {out.stderr or out.stdout}")
        return out.stdout

    def start(self) -> None:
        for port in self.ports:
            self._start_node(port)
        for port in self.ports:
            _wait(functools.partial(self._answers, port, "PONG", "ping"), f"redis :{port}")
        if not self.cluster:
            return
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        self._cli(self.ports[0], "--cluster", "create", *nodes, "--cluster-replicas", "0",
                  "--cluster-yes")  # fmt: skip
        for port in self.ports:
            ok = functools.partial(self._answers, port, "cluster_state:ok", "cluster", "info")
            _wait(ok, f"cluster_state:ok on :{port}")

    def _answers(self, port: int, want: str, *command: str) -> bool:
        return want in self._cli(port, *command)

    def keys_per_node(self) -> dict[int, int]:
        """DBSIZE of every live node."""
        return {p: int(self._cli(p, "dbsize").strip()) for p in self.ports if self.alive(p)}

    def alive(self, port: int) -> bool:
        proc = self.procs.get(port)
        return proc is not None and proc.poll() is None

    def kill(self, port: int) -> None:
        proc = self.procs.pop(port, None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    def stop(self) -> None:
        for port in list(self.procs):
            self.kill(port)


class MooncakeProcs:
    """A `mooncake_master` with its HTTP metadata server, plus one `mooncake_client` store
    service contributing `segment_bytes` of memory."""

    def __init__(self, workdir: Path, segment_bytes: int = 256 << 20) -> None:
        self.master_exe = _exe("mooncake_master", "pip install mooncake-transfer-engine-non-cuda")
        self.client_exe = _exe("mooncake_client", "pip install mooncake-transfer-engine-non-cuda")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.rpc_port, self.http_port = free_port(), free_port()
        self.metrics_port, self.client_port = free_port(), free_port()
        self.segment_bytes = segment_bytes
        self.master: subprocess.Popen[bytes] | None = None
        self.store: subprocess.Popen[bytes] | None = None

    @property
    def master_address(self) -> str:
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def metadata_server(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/metadata"

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        with open(self.workdir / log_name, "ab") as log:  # the child keeps its own copy
            return subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent()
            )

    def start_master(self) -> None:
        args = [self.master_exe, "--enable_http_metadata_server=true"]
        args += [
            "--http_metadata_server_host=127.0.0.1",
            f"--http_metadata_server_port={self.http_port}",
        ]
        args += ["--rpc_address=127.0.0.1", f"--rpc_port={self.rpc_port}"]
        args += [f"--metrics_port={self.metrics_port}", "--metrics_host=127.0.0.1"]
        self.master = self._spawn(args, "master.log")
        _wait(self._up, "mooncake_master")

    def _up(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.rpc_port), timeout=0.5):
            pass
        # Any HTTP answer (404 for an unknown key) means the metadata server is up.
        with contextlib.suppress(urllib.error.HTTPError):
            urllib.request.urlopen(self.metadata_server + "?key=probe", timeout=0.5).close()
        return True

    def start_store(self) -> None:
        self._kill(self.store)  # never orphan a running one
        args = [self.client_exe, "--host=127.0.0.1", f"--port={self.client_port}"]
        args += [f"--global_segment_size={self.segment_bytes}", "--protocol=tcp"]
        args += [f"--master_server_address={self.master_address}"]
        args += [f"--metadata_server={self.metadata_server}"]
        self.store = self._spawn(args, "store.log")
        _wait(self._mounted, "mooncake_client's segment")

    def _mounted(self) -> bool:
        """The master counts the store service's memory (its Prometheus metrics)."""
        if self.store is not None and self.store.poll() is not None:
            raise ServiceDied(f"mooncake_client exited: see {self.workdir / 'store.log'}")
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=1.0) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("master_total_capacity_bytes "):
                    return float(line.split()[1]) >= self.segment_bytes
        return False

    def start(self) -> None:
        self.start_master()
        self.start_store()

    def client_config(self) -> dict[str, object]:
        """A Mooncake JSON config for clients of this deployment (no segment of their own:
        pages live in the store service and outlive the engines)."""
        return {
            "master_server_address": self.master_address,
            "metadata_server": self.metadata_server,
            "global_segment_size": 0,
            "local_buffer_size": 64 << 20,
            "protocol": "tcp",
            "local_hostname": "127.0.0.1",
        }

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes] | None) -> None:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    def kill_master(self) -> None:
        self._kill(self.master)
        self.master = None

    def restart(self) -> None:
        """A fresh, empty deployment on the same master ports (the store service restarted
        too: it does not remount its segment on a new master by itself)."""
        self._kill(self.store)
        self.kill_master()
        self.client_port = free_port()
        self.start()

    def stop(self) -> None:
        self._kill(self.store)
        self.store = None
        self.kill_master()

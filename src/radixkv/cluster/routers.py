"""The existing routers a cluster runs behind, each in a virtualenv of its own.

RadixKV has no router of its own: `smg` (the SGLang Model Gateway) and `vllm-router` are Rust
binaries shipped in Python wheels with dependencies of their own, so each is installed on first
use, pinned, into a cached virtualenv (`routers/NAME-VERSION` beside the model cache, default
~/.cache/radixkv/routers/), guarded by a file lock (two processes never build one at once) and
marked complete only once pip succeeded. `router_python` returns that virtualenv's interpreter
(`cached_venv` does the same for any pinned requirement).

`RouterPlan.command()` is the command line that starts one router in front of the given workers,
on loopback, with its side listeners (Prometheus) on free loopback ports too.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from radixkv.storage.local_services import free_port

# The versions checked against RadixKV's replicas (docs/deploy.md); pinned on purpose.
ROUTER_PACKAGES = {"smg": "smg==1.13.0", "vllm-router": "vllm-router==0.1.17"}
ROUTERS = (*ROUTER_PACKAGES, "none")
# pip's words when it cannot reach a package index (RouterInstallError.offline).
OFFLINE_WORDS = (
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "Max retries exceeded",
    "ProxyError",
    "No matching distribution found",
    "Could not find a version that satisfies",
)


# A router registers each `--worker-urls` worker in the background, re-trying one that does not
# answer (down when the router started or restarted) every this many seconds: 30 by default in
# both, which left a returning replica without traffic (a one-replica cluster answering 404 No
# worker available) for up to half a minute. Loopback probes are cheap.
STARTUP_CHECK = ["--worker-startup-check-interval", "1"]
# Both probe a registered worker's /health every 60 s by default and open a worker's circuit
# breaker for 60 s after 10 failed requests: a SIGKILLed replica kept drawing requests (each
# failing, then retried) until the next probe, and once back and healthy got no traffic for up
# to a minute more. Replicas on this host answer /health from their HTTP process (never behind
# a long prefill), so probing every 2 s is cheap; after 5 s an open breaker lets a request try.
HEALTH = ["--health-check-interval-secs", "2", "--cb-timeout-duration-secs", "5"]


class RouterInstallError(RuntimeError):
    """pip could not install a router; `offline` when it could not reach the package index."""

    def __init__(self, message: str, offline: bool) -> None:
        super().__init__(message)
        self.offline = offline


def routers_dir() -> Path:
    """Beside the CPU kernels' build folders: the parent of the model cache
    (`$RADIXKV_CACHE_DIR`, default ~/.cache/radixkv/models)."""
    env = os.environ.get("RADIXKV_CACHE_DIR")
    models = Path(env) if env else Path.home() / ".cache" / "radixkv" / "models"
    return models.parent / "routers"


def router_python(router: str, root: Path | None = None) -> Path:
    """The interpreter of a virtualenv holding `router`'s pinned package, made once then reused.

    Raises RouterInstallError when pip fails (its `offline` says whether the index was
    unreachable)."""
    if router not in ROUTER_PACKAGES:
        raise ValueError(f"no package for router {router!r}")
    return cached_venv(ROUTER_PACKAGES[router], root)


def cached_venv(requirement: str, root: Path | None = None) -> Path:
    """The interpreter of a virtualenv holding `requirement` (pinned: `NAME==VERSION`), made once
    under `root` (default `routers_dir()`) then reused; for routers and the tools that check
    their set-ups (tests/cluster validates deploy/ with one)."""
    root = root or routers_dir()
    venv = root / requirement.replace("==", "-")
    python = venv / "bin" / "python"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / ".complete").exists():
            return python
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        done = subprocess.run([*pip, requirement], capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            out = done.stdout + done.stderr
            shutil.rmtree(venv, ignore_errors=True)
            why = [ln.strip() for ln in out.splitlines() if any(w in ln for w in OFFLINE_WORDS)]
            if why:
                reason = " / ".join(dict.fromkeys([why[0], why[-1]]))
                msg = f"pip cannot reach the package index for {requirement}: {reason}"
                raise RouterInstallError(msg, offline=True)
            raise RouterInstallError(f"pip install {requirement} failed:\n{out[-3000:]}", False)
        (venv / ".complete").write_text(requirement + "\n")
    return python


@dataclass(frozen=True)
class RouterPlan:
    """What starts one router and how to tell it is serving."""

    router: str
    python: Path
    port: int
    policy: str
    worker_urls: tuple[str, ...]
    api_key: str | None = None
    # For vllm-router kv_aware: each worker's event PUB and replay endpoints, the block size
    # and the model name the workers serve.
    event_sources: tuple[tuple[str, str, str | None], ...] = ()
    block_size: int = 16
    model_name: str | None = None
    extra_args: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        if self.router == "smg":
            cmd = [str(self.python), "-m", "smg", "launch", "--host", "127.0.0.1"]
            cmd += ["--port", str(self.port), "--worker-urls", *self.worker_urls]
            cmd += ["--policy", self.policy, "--disable-tokenizer-autoload"]
            # Its Prometheus listener defaults to 0.0.0.0:29000: loopback, a free port.
            cmd += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
            cmd += ["--load-monitor-interval", "1", "--log-level", "warn"]
            cmd += [*STARTUP_CHECK, *HEALTH]
        elif self.router == "vllm-router":
            exe = self.python.parent / "vllm-router"
            cmd = [str(exe), "--host", "127.0.0.1", "--port", str(self.port)]
            cmd += ["--worker-urls", *self.worker_urls, "--policy", self.policy]
            cmd += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
            cmd += ["--log-level", "warning", *STARTUP_CHECK, *HEALTH]
            for url, endpoint, replay in self.event_sources:
                cmd += ["--kv-event-source", f"{url}={endpoint}"]
                if replay is not None:
                    cmd += ["--kv-event-replay-source", f"{url}={replay}"]
            if self.event_sources:
                cmd += ["--kv-event-block-size", str(self.block_size)]
                if self.model_name is not None:
                    cmd += ["--kv-event-model", self.model_name]
        else:
            raise ValueError(f"unknown router {self.router!r} (one of {', '.join(ROUTERS)})")
        if self.api_key is not None:
            cmd += ["--api-key", self.api_key]
        return [*cmd, *self.extra_args]

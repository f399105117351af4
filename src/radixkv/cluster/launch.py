"""N `radixkv serve` replicas behind an existing router, on one machine (tests, benchmarks and
`radixkv cluster up`).

    spec = ClusterSpec(replicas=2, model="smollm2-135m", serve_args=("--num-slots", "4096"))
    with start_cluster(spec) as cluster:
        client = openai.OpenAI(base_url=cluster.router_url + "/v1", api_key="unused")

Everything binds 127.0.0.1 on free ports: the replicas (`worker_urls`), the router
(`router_url`: smg or vllm-router from a cached virtualenv, see `routers`; None with
router="none"), a redis-server for a shared L3 (`redis_url`, every replica gets
`--hicache-storage-backend redis`), and with `kv_events` each replica's ZMQ PUB and replay
sockets (bound by the replica: `kv_event_endpoints`, `kv_replay_endpoints`). A restarted replica
or router comes back on the same ports, so the router and event subscribers find it again.
Logs (one file per process, appended across restarts) go to `log_dir` (a new temp dir unless
given). Leaving the `with` block, an exception, SIGTERM/SIGHUP (while the cluster runs in the
main thread) or interpreter exit stops every process it started. A temp dir of its own is removed
after a clean stop (the block left normally, Ctrl-C, SIGTERM/SIGHUP) and kept when something
failed (an exception, which then carries a note naming it, or a process that had exited on its
own): a warning says where. A `log_dir` given is always kept.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from radixkv.cluster.procs import Child, ClusterError, stop_all
from radixkv.cluster.routers import ROUTERS, RouterPlan, router_python
from radixkv.storage.local_services import RedisClusterProcs, free_port

__all__ = ["ClusterError", "ClusterSpec", "RunningCluster", "start_cluster"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterSpec:
    """What to start. `serve_args` go to every replica (`--port`, `--host`, `--model`, the
    `--api-key` and the L3 / event flags are the launcher's); `replica_args[i]`, when given,
    are added to replica i's alone."""

    replicas: int
    model: str | None
    serve_args: tuple[str, ...]
    policy: str = "cache_aware"
    router: str = "smg"  # or "vllm-router" or "none"
    shared_l3: bool = False  # a redis-server; each replica gets --hicache-storage-backend redis
    kv_events: bool = False
    # Keys added to every replica's --kv-events-config (e.g. ("seq_start", "time")).
    kv_events_options: tuple[tuple[str, object], ...] = ()
    router_python: str | None = None  # an interpreter with the router installed (else cached)
    api_key: str | None = None  # required by the replicas and the router alike
    replica_args: tuple[tuple[str, ...], ...] = ()
    router_args: tuple[str, ...] = ()
    log_dir: str | None = None
    ready_timeout_s: float = 300.0  # a cold start may build the CPU kernels first
    python: str | None = None  # the interpreter that runs `radixkv serve` (default: this one)

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError("replicas must be >= 1")
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}, not {self.router!r}")
        if len(self.replica_args) > self.replicas:
            raise ValueError("more replica_args than replicas")


def _flag(args: tuple[str, ...], name: str) -> str | None:
    """The value of `--name V` or `--name=V` in `args` (the last one wins), else None."""
    out = None
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            out = args[i + 1]
        elif a.startswith(name + "="):
            out = a.split("=", 1)[1]
    return out


def event_block_size(serve_args: tuple[str, ...]) -> int:
    """The block size replicas announce by default: the smallest multiple of the page that is at
    least 16 tokens (docs/kv-events.md)."""
    page = int(_flag(serve_args, "--page-size") or 1)
    return page * -(-16 // page)


@dataclass
class RunningCluster:
    """A started cluster; `stop()` (or leaving `start_cluster`'s block) ends it."""

    spec: ClusterSpec
    log_dir: Path
    workers: list[Child]
    worker_urls: list[str]
    kv_event_endpoints: list[str]
    kv_replay_endpoints: list[str]
    redis_url: str | None = None
    router_url: str | None = None
    model_name: str | None = None
    router: Child | None = None
    _plan: RouterPlan | None = field(default=None, repr=False)
    _redis: RedisClusterProcs | None = field(default=None, repr=False)
    _stopped: bool = False
    crashed: list[str] = field(default_factory=list)  # set by stop(): who had exited on its own

    @property
    def headers(self) -> dict[str, str]:
        key = self.spec.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    # -- replicas ---------------------------------------------------------------------------------
    def _worker_up(self, i: int) -> bool:
        return httpx.get(self.worker_urls[i] + "/health", timeout=2).status_code == 200

    def kill_worker(self, i: int) -> None:
        """SIGKILL replica i (a crash: no clean shutdown, no final AllBlocksCleared)."""
        self.workers[i].kill()

    def restart_worker(self, i: int) -> None:
        """Start replica i again on its ports (stopped cleanly first if it still runs); return
        once it serves and the router counts it healthy again."""
        child = self.workers[i]
        child.terminate()
        child.start()
        child.wait_ready(lambda: self._worker_up(i), self.spec.ready_timeout_s)
        if self.router is not None:
            self.router.wait_ready(self._router_ready, self.spec.ready_timeout_s)

    # -- the router -------------------------------------------------------------------------------
    def router_workers(self) -> list[dict[str, Any]]:
        """The router's own view of its workers (smg's and vllm-router's `GET /workers`)."""
        assert self.router_url is not None
        r = httpx.get(self.router_url + "/workers", headers=self.headers, timeout=10)
        r.raise_for_status()
        return list(r.json()["workers"])

    def _router_ready(self) -> bool:
        """Every live replica registered and healthy in the router's eyes."""
        live = {u for u, c in zip(self.worker_urls, self.workers, strict=True) if c.alive}
        healthy = {w["url"] for w in self.router_workers() if w.get("is_healthy", True)}
        return live <= healthy

    def restart_router(self) -> None:
        """SIGKILL the router and start it again on its port (with the same workers)."""
        if self.router is None:
            raise ClusterError("this cluster runs without a router")
        self.router.kill()  # smg holds its listener through a 5 s drain on SIGTERM
        self.router.start()
        self.router.wait_ready(self._router_ready, self.spec.ready_timeout_s)

    # -- the whole --------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the router, then the replicas (cleanly), then Redis; first note in `crashed`
        every process that had exited on its own. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        children = [*self.workers, *([self.router] if self.router is not None else [])]
        self.crashed = [c.name for c in children if c.crashed]
        if self.router is not None:
            self.router.kill()
        stop_all(self.workers)
        if self._redis is not None:
            self._redis.stop()


def _replica_command(spec: ClusterSpec, i: int, port: int, extra: list[str]) -> list[str]:
    cmd = [spec.python or sys.executable, "-m", "radixkv", "serve"]
    if spec.model is not None:
        cmd += ["--model", spec.model]
    cmd += ["--host", "127.0.0.1", "--port", str(port), *spec.serve_args]
    if i < len(spec.replica_args):
        cmd += list(spec.replica_args[i])
    if spec.api_key is not None:
        cmd += ["--api-key", spec.api_key]
    return cmd + extra


def _start_workers(spec: ClusterSpec, cluster: RunningCluster) -> None:
    block = event_block_size(spec.serve_args)
    for i in range(spec.replicas):
        port = free_port()
        extra: list[str] = []
        if cluster.redis_url is not None:
            extra += ["--hicache-storage-backend", "redis"]
            extra += ["--hicache-storage-url", cluster.redis_url]
        if spec.kv_events:
            pub = f"tcp://127.0.0.1:{free_port()}"
            rep = f"tcp://127.0.0.1:{free_port()}"
            cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": pub}
            cfg.update({"replay_endpoint": rep, "topic": "", "bind": True, "block_size": block})
            if spec.router == "vllm-router":  # it applies replayed batches in this layout only
                cfg["replay_layout"] = "topic"
            cfg.update(dict(spec.kv_events_options))
            extra += ["--kv-events-config", json.dumps(cfg)]
            cluster.kv_event_endpoints.append(pub)
            cluster.kv_replay_endpoints.append(rep)
        cmd = _replica_command(spec, i, port, extra)
        child = Child(f"replica {i}", cmd, cluster.log_dir / f"replica{i}.log")
        cluster.workers.append(child)
        cluster.worker_urls.append(f"http://127.0.0.1:{port}")
        child.start()  # all start at once; then each is waited for
    for i, child in enumerate(cluster.workers):
        child.wait_ready(lambda i=i: cluster._worker_up(i), spec.ready_timeout_s)  # type: ignore[misc]


def _model_name(spec: ClusterSpec, cluster: RunningCluster) -> str:
    named = _flag(spec.serve_args, "--served-model-name")
    if named is not None:
        return named
    r = httpx.get(cluster.worker_urls[0] + "/v1/models", headers=cluster.headers, timeout=10)
    return str(r.json()["data"][0]["id"])


def _start_router(spec: ClusterSpec, cluster: RunningCluster) -> None:
    python = Path(spec.router_python) if spec.router_python else router_python(spec.router)
    sources: tuple[tuple[str, str, str | None], ...] = ()
    # vllm-router refuses event sources with any other policy.
    if spec.kv_events and spec.router == "vllm-router" and spec.policy == "kv_aware":
        sources = tuple(
            zip(
                cluster.worker_urls,
                cluster.kv_event_endpoints,
                cluster.kv_replay_endpoints,
                strict=True,
            )
        )
    plan = RouterPlan(
        spec.router, python, free_port(), spec.policy, tuple(cluster.worker_urls),
        spec.api_key, sources, event_block_size(spec.serve_args), cluster.model_name,
        spec.router_args,
    )  # fmt: skip
    cluster._plan, cluster.router_url = plan, plan.url
    cluster.router = Child(spec.router, plan.command(), cluster.log_dir / "router.log")
    cluster.router.start()
    cluster.router.wait_ready(cluster._router_ready, spec.ready_timeout_s)


@contextlib.contextmanager
def _stop_on_signals(stop: Any) -> Iterator[None]:
    """SIGTERM / SIGHUP end the cluster as Ctrl-C does (main thread, default handlers only)."""
    atexit.register(stop)
    saved: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):

                def raise_exit(signum: int, frame: FrameType | None) -> None:
                    raise SystemExit(128 + signum)

                saved[sig] = signal.signal(sig, raise_exit)
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)
        atexit.unregister(stop)


@contextlib.contextmanager
def start_cluster(spec: ClusterSpec) -> Iterator[RunningCluster]:
    """Start Redis (if asked), the replicas, then the router; yield once every replica answers
    `/health` and the router counts them all healthy. Raises ClusterError (with the log's tail)
    when a process exits or is not ready in time, RouterInstallError when the router cannot be
    installed. Logs: see the module's docstring."""
    log_dir = Path(spec.log_dir or tempfile.mkdtemp(prefix="radixkv-cluster-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    cluster = RunningCluster(spec, log_dir, [], [], [], [])
    failure: str | None = "it did not finish"
    with _stop_on_signals(cluster.stop):
        try:
            if spec.shared_l3:
                cluster._redis = RedisClusterProcs(log_dir / "redis", nodes=1, cluster=False)
                cluster._redis.start()
                cluster.redis_url = cluster._redis.url
            _start_workers(spec, cluster)
            cluster.model_name = _model_name(spec, cluster)
            if spec.router != "none":
                _start_router(spec, cluster)
            yield cluster
            failure = None
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            failure = None  # Ctrl-C, SIGTERM/SIGHUP: the ways to stop it
            raise
        except BaseException as exc:
            failure = f"{type(exc).__name__}: {exc}".splitlines()[0]
            exc.add_note(f"cluster logs kept in {log_dir}")
            raise
        finally:
            cluster.stop()
            if failure is None and cluster.crashed:
                failure = f"{', '.join(cluster.crashed)} exited on its own"
            _tidy_logs(log_dir, own=spec.log_dir is None, failure=failure)


def _tidy_logs(log_dir: Path, own: bool, failure: str | None) -> None:
    """Remove a temp log dir of our own after a clean stop; otherwise keep it, saying where."""
    if failure is not None:
        log.warning("cluster logs kept in %s (%s)", log_dir, failure)
    elif own:
        shutil.rmtree(log_dir, ignore_errors=True)

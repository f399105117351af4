"""The engine process: `python -m radixkv.server.engine_link.engine_proc_main`, started by
ProcessEngine.

It reads its EngineSpec from stdin, builds the engine (sending EngineInfo, or StartupError and
exit 1), then runs EngineCore over the ZeroMQ sockets until told to stop.

It never outlives the API process, however that one ends:
- stdin stays open for its whole life: EOF on it means the API process is gone (a watchdog thread
  waits on it and also checks that the parent pid has not changed);
- PR_SET_PDEATHSIG (Linux) makes the kernel send SIGTERM when the parent dies, when the spawning
  thread is the parent's main thread (the signal follows the spawning thread, not the process);
- SIGTERM and parent death set the stop flag: the loop ends after the current step and the
  process exits; if the step does not end within EXIT_GRACE_S, the watchdog exits hard. The
  flag takes no lock: a signal handler runs in the main thread between any two bytecodes, also
  inside a lock that thread holds (threading.Event.set in an earlier handler: SIGTERM can come
  more than once), so a handler that locks can deadlock the process it is meant to end.
- SIGINT is ignored: Ctrl-C in a terminal reaches the whole process group, and the API process
  decides when the engine stops (after its HTTP side has drained).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from radixkv.server.engine_link import ipc
from radixkv.server.engine_link.engine_core import (
    Command,
    EngineCore,
    EngineInfo,
    Outputs,
    by_value,
)

log = logging.getLogger("radixkv.server")

EXIT_GRACE_S = 5.0
# Once told to go (SIGTERM, or the API process gone), the kernel ends us after this long whatever
# Python is doing: SIGALRM's default action needs no GIL, no lock and no live thread. It covers the
# engine's own bounded shutdown work (e.g. flushing pending L3 writes) with room to spare.
HARD_EXIT_S = 30
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class EngineSpec:
    """How to build and connect the engine; pickled by the API process onto our stdin."""

    factory: Callable[[], Any]  # picklable: builds the engine (e.g. partial(build_engine, cfg))
    commands_address: str
    outputs_address: str
    parent_pid: int
    threads: int = 0  # torch CPU threads (0: torch's default)
    log_level: str = "info"
    pdeathsig: bool = True


class StopFlag:
    """Set from signal handlers and the watchdog thread, read by the engine loop. Invariant:
    set() and is_set() take no lock and never block (one attribute store, one load)."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop = StopFlag()
    signal.signal(signal.SIGTERM, lambda *_: _stop_soon(stop))
    spec: EngineSpec = ipc.read_frame(0)
    logging.basicConfig(
        level=spec.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s [engine]: %(message)s",
    )
    if spec.pdeathsig:
        _set_pdeathsig()
    threading.Thread(
        target=_watch_parent, args=(spec, stop), name="parent-watchdog", daemon=True
    ).start()
    if os.getppid() != spec.parent_pid:  # it died before the watchdog was up
        return 1
    if spec.threads > 0:
        import torch

        torch.set_num_threads(spec.threads)
    keep_freed_memory()
    ctx: zmq.Context[Any] = zmq.Context()
    rx = ipc.open_socket(ctx, zmq.PULL, spec.commands_address, bind=False)
    tx = ipc.open_socket(ctx, zmq.PUSH, spec.outputs_address, bind=False, linger_ms=2000)
    try:
        return _serve(spec, rx, tx, stop)
    finally:
        rx.close()
        tx.close()
        ctx.term()


def keep_freed_memory(limit: int = 1 << 30) -> bool:
    """Tell glibc's malloc to serve blocks up to `limit` bytes from its heap and keep up to
    `limit` freed bytes instead of returning them: a forward pass allocates and frees the same
    tens-of-MB activations every step, which by default are fresh mmaps (page faults and zeroing
    each time). Measured: a 1,088-token float32 prefill 1,681 -> 1,607 ms. The engine process owns
    its memory, so holding freed memory is harmless; RADIXKV_MALLOC_TUNE=0 turns it off. Returns
    whether it applied (False off glibc)."""
    if os.environ.get("RADIXKV_MALLOC_TUNE", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
        return bool(libc.mallopt(m_mmap_threshold, limit) and libc.mallopt(m_trim_threshold, limit))
    except (OSError, AttributeError):
        return False


def _serve(spec: EngineSpec, rx: zmq.Socket[Any], tx: zmq.Socket[Any], stop: StopFlag) -> int:
    try:
        engine = spec.factory()
        info = EngineInfo.of(engine, os.getpid())
    except Exception as exc:
        log.debug("engine start-up failed", exc_info=True)
        tx.send(ipc.dumps(ipc.StartupError(f"{type(exc).__name__}: {exc}")))
        return 1
    tx.send(ipc.dumps(info))

    def recv(timeout: float) -> Sequence[Command]:
        return ipc.recv_ready(rx, timeout)

    def emit(out: Outputs) -> None:
        try:
            data = ipc.dumps(out)
        except Exception:  # an unpicklable call result: send it as an error instead
            out.results = by_value(out.results)
            data = ipc.dumps(out)
        tx.send(data)

    fatal = EngineCore(engine).run(recv, emit, stop.is_set)
    if hasattr(engine, "close"):  # e.g. flush pending L3 writes (bounded) before exiting
        try:
            engine.close()
        except Exception:
            log.exception("closing the engine failed")
    return 0 if fatal is None else 1


def _set_pdeathsig() -> None:
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _stop_soon(stop: StopFlag) -> None:
    """Arm the kernel's hard stop (once: a later call must not push it back), then ask the main
    loop to finish. Safe in a signal handler: no lock, no I/O."""
    if not stop.is_set():
        signal.alarm(HARD_EXIT_S)
    stop.set()


def _watch_parent(spec: EngineSpec, stop: StopFlag) -> None:
    """End the process once the API process died (stdin EOF or a new parent pid)."""
    parent_pid = spec.parent_pid
    while True:
        readable, _, _ = select.select([0], [], [], 1.0)
        if readable:
            try:
                gone = not os.read(0, 4096)  # the parent never writes after the spec
            except OSError:
                gone = True
        else:
            gone = False
        if gone or os.getppid() != parent_pid:
            break
    _stop_soon(stop)
    log.warning("the API process (pid %d) is gone; engine process exiting", parent_pid)
    # Nobody else will remove the API process's private socket directory now.
    sockets = Path(spec.commands_address.removeprefix("ipc://")).parent
    if sockets.name.startswith("radixkv-"):
        shutil.rmtree(sockets, ignore_errors=True)
    time.sleep(EXIT_GRACE_S)  # the main loop normally exits first (the process ends with it)
    os._exit(1)


if __name__ == "__main__":
    code = main()
    # Everything that matters is closed above; skip interpreter finalization, which can hang on
    # threads left by libraries (compile workers, daemon threads waiting for the GIL).
    logging.shutdown()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)

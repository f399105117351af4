"""The wire between the API process and the engine process: ZeroMQ PUSH/PULL over ipc:// sockets,
one pickled object per message.

Why pickle: both ends are our own trusted processes (the sockets live in a private 0700 temp
directory), and pickle carries the engine/types dataclasses (SamplingParams, RequestOptions,
StreamDelta, EngineMetrics...) and `operator.methodcaller` calls generically, so a field another
branch adds needs no transport change. A step's message (8 deltas + a metrics snapshot) encodes
and decodes in tens of microseconds (see `python -m radixkv.server.engine_link.ipc`), against a
decode step of tens of milliseconds.

Topology: the API process binds both sockets; the engine process connects.
    commands: API PUSH → engine PULL   (AddCmd, AbortCmd, CallCmd, StopCmd)
    outputs:  engine PUSH → API PULL   (EngineInfo or StartupError once, then Outputs)
High-water marks are off (messages are small and bounded by the in-flight limit), so a send never
drops or blocks while the peer is alive.
"""

from __future__ import annotations

import pickle
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

PROTOCOL = pickle.HIGHEST_PROTOCOL


def dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=PROTOCOL)


def loads(data: bytes) -> Any:
    return pickle.loads(data)


@dataclass(frozen=True)
class StartupError:
    """The engine process could not build its engine (sent instead of EngineInfo, then it exits)."""

    message: str


def addresses(directory: Path) -> tuple[str, str]:
    """(commands, outputs) socket addresses inside `directory` (kept short: AF_UNIX paths ≤ 107)."""
    return f"ipc://{directory / 'cmd'}", f"ipc://{directory / 'out'}"


def open_socket(
    ctx: zmq.Context[Any], kind: int, address: str, bind: bool, linger_ms: int = 0
) -> zmq.Socket[Any]:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, linger_ms)
    if bind:
        sock.bind(address)
    else:
        sock.connect(address)
    return sock


def recv_ready(sock: zmq.Socket[Any], timeout_s: float) -> list[Any]:
    """Every message waiting on `sock`, decoded; waits up to timeout_s for the first one."""
    if timeout_s > 0 and not sock.poll(int(timeout_s * 1000)):
        return []
    out = []
    while True:
        try:
            out.append(loads(sock.recv(zmq.NOBLOCK)))
        except zmq.Again:
            return out


# ---- the spec handed to the engine process on its stdin (length-prefixed pickle) ----
def write_frame(fd_write: Any, obj: Any) -> None:
    data = dumps(obj)
    fd_write.write(struct.pack("<Q", len(data)) + data)
    fd_write.flush()


def read_frame(fd: int) -> Any:
    import os

    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                raise EOFError("the API process closed the pipe before sending the engine spec")
            buf += chunk
        return buf

    (size,) = struct.unpack("<Q", exactly(8))
    return loads(exactly(size))


def _bench(n: int = 2000) -> None:
    """Encode/decode cost of a typical decode-step message (8 streams)."""
    from radixkv.engine.types import EngineMetrics, StreamDelta
    from radixkv.server.engine_link.engine_core import Outputs

    metrics = EngineMetrics(8, 0, 100_000, 90_000, 2048, 0, 2048, 0, 512, 0, 0)
    out = Outputs(
        deltas=[
            StreamDelta(f"cmpl-{i:032x}", [1234], " word", prompt_tokens=256, completion_tokens=9)
            for i in range(8)
        ],
        metrics=metrics,
        steps=100,
    )
    t0 = time.perf_counter()
    for _ in range(n):
        data = dumps(out)
    t1 = time.perf_counter()
    for _ in range(n):
        loads(data)
    t2 = time.perf_counter()
    print(
        f"pickle protocol {PROTOCOL}: one 8-stream step message is {len(data)} bytes; "
        f"encode {1e6 * (t1 - t0) / n:.1f} µs, decode {1e6 * (t2 - t1) / n:.1f} µs"
    )


if __name__ == "__main__":
    _bench()

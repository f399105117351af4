"""`wait_healthy`, the start-up wait every server test and `ServerProcess` share: it returns None
only once /health answers, and otherwise says why (the process exited, or the time ran out)."""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from radixkv.bench.serving.server_proc import wait_healthy


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _sleeper(seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def test_healthy_server_returns_none() -> None:
    server = HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proc = _sleeper(30)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert wait_healthy(url, proc, 10, 0.05) is None
    finally:
        proc.kill()
        proc.wait()
        server.shutdown()


def test_exited_process_and_timeout_are_reported() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    dead.wait()
    why = wait_healthy("http://127.0.0.1:9", dead, 10, 0.05, output=lambda: "its log")
    assert why == "server exited with 3; its log"
    alive = _sleeper(30)
    try:
        why = wait_healthy("http://127.0.0.1:9", alive, 0.3, 0.05)
        assert why == "server not healthy after 0.3 s"
    finally:
        alive.kill()
        alive.wait()

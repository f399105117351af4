#!/usr/bin/env python
"""Do the tiers pay on an idle server with default flags? Drives real `radixkv serve` processes
over one Redis (started here on a free port) and prints cached_tokens for three moments:

1. L2: prompt A, then enough other prompts to push A out of the device pool, then A again;
2. restart: the server is stopped cleanly and a new one on the same Redis gets prompt B again;
3. second server: two servers on the same Redis; the first computes prompt C, the second gets C.

    .venv/bin/python scripts/tiers_idle.py --model DIR [--prompt-len 1500] [-- extra serve flags]
    .venv/bin/python scripts/tiers_idle.py --tiny /tmp/tiny-llama   # builds the tests' tiny Llama

Defaults follow the tiers issue's scenario: page 16, 4,000 device slots, 1,500-token prompts,
float32, `--enable-hierarchical-cache --hicache-storage-backend redis` and every other flag
(prefetch policy included) at its default.
Prints one JSON object (cached tokens per moment, and the /cache/stats tier figures).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx

from radixkv.model import default_model_path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, args: argparse.Namespace, redis_url: str, log: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "radixkv.cli", "serve", "--model", args.model]
        cmd += ["--port", str(self.port), "--served-model-name", "m"]
        cmd += ["--page-size", "16", "--num-slots", str(args.slots)]
        cmd += ["--enable-hierarchical-cache", "--hicache-storage-backend", "redis"]
        cmd += ["--hicache-storage-url", redis_url, "--dtype", "float32", *args.extra]
        self.log = open(log, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}); see {log}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.proc.kill()
        raise RuntimeError("server did not start")

    def complete(self, ids: list[int]) -> int:
        body = {"model": "m", "prompt": ids, "max_tokens": 4, "temperature": 0}
        body["ignore_eos"] = True
        r = httpx.post(self.url + "/v1/completions", json=body, timeout=300)
        r.raise_for_status()
        return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = httpx.get(self.url + "/cache/stats", timeout=30).json()
        return out

    def settle(self, timeout: float = 30.0) -> None:
        """Wait until the server's L3 writes are confirmed (an idle server finishes them)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.stats()["tier_stats"].get("storage_pending_writes", 0) == 0:
                return
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # a clean shutdown flushes pending L3 writes
        self.proc.wait(timeout=120)
        self.log.close()


def tiny_llama(out: str) -> str:
    """The test suite's tiny Llama (tests/conftest.py), with the default model's tokenizer."""
    if not os.path.exists(os.path.join(out, "config.json")):
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from conftest import build_tiny_checkpoint

        Path(out).mkdir(parents=True, exist_ok=True)
        build_tiny_checkpoint(
            Path(out), "llama", Path(default_model_path()), max_position_embeddings=2048
        )
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="HF checkpoint directory")
    p.add_argument(
        "--tiny",
        metavar="DIR",
        help="instead: the tests' tiny seeded Llama (max positions 2048), built into DIR once",
    )
    p.add_argument("--prompt-len", type=int, default=1500)
    p.add_argument("--slots", type=int, default=4000, help="device pool (tokens)")
    p.add_argument("--log", default=None, help="server logs (default: a temporary file)")
    p.add_argument("extra", nargs="*", help="extra `radixkv serve` flags (after --)")
    args = p.parse_args()
    if args.tiny:
        args.model = tiny_llama(args.tiny)
    if not args.model:
        p.error("--model or --tiny is required")
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server is not installed")
    tmp = tempfile.mkdtemp(prefix="radixkv-idle-")
    log = args.log or os.path.join(tmp, "serve.log")
    port = free_port()
    redis = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", tmp],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    rng = random.Random(0)
    prompt = [[rng.randrange(1000, 30000) for _ in range(args.prompt_len)] for _ in range(8)]
    out: dict[str, Any] = {"prompt_len": args.prompt_len, "slots": args.slots, "flags": args.extra}
    servers: list[Server] = []
    try:
        time.sleep(0.3)
        a = Server(args, url, log)
        servers.append(a)
        a.complete(prompt[0])
        others = args.slots // args.prompt_len + 1  # enough to push prompt 0 out of L1
        for i in range(1, 1 + others):
            a.complete(prompt[i])
        out["l2_after_l1_eviction"] = a.complete(prompt[0])
        st = a.stats()
        out["l2_stats"] = st["tier_stats"]
        out["l2_by_tier"] = st["cached_tokens_by_tier"]
        b_prompt = prompt[1]
        a.stop()
        a = Server(args, url, log)  # restarted: empty tree, empty host pool, same Redis
        servers.append(a)
        out["restart"] = a.complete(b_prompt)
        b = Server(args, url, log)  # a second server on the same Redis
        servers.append(b)
        a.complete(prompt[7])
        a.settle()
        out["second_server"] = b.complete(prompt[7])
        st = b.stats()
        out["second_stats"] = st["tier_stats"]
        out["second_by_tier"] = st["cached_tokens_by_tier"]
    finally:
        for s in servers:
            s.stop()
        redis.kill()
        redis.wait()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The serving part of the device check (scripts/gpu_check.py; issue 35, item 4).

- `prefix_ttft`: time to first token of a request whose 2,048-token prefix is cached, against the
  same request with nothing cached, through the Engine on the device (no HTTP): each cold request
  gets a fresh random prefix, each warm one the previous cold prefix and a new suffix. The
  median over `reps` pairs, and the cut (cold / warm), which the issue wants at 5x or more.
- `serve_run`: `radixkv serve` on the device and `radixkv bench serve` against it, one workload
  (`prefix`: groups sharing a long system prompt; `random`: every prompt its own), reading the
  summary the client writes.

Both run on CPU too (tests, and `scripts/gpu_check.py --device cpu`), with small sizes.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

# (prefix, suffix) tokens of one request; the suffix is what a hit still computes.
PREFIX_TOKENS = 2048
SUFFIX_TOKENS = 32
# `radixkv bench serve` shapes: kept small, a device session has minutes (prompt lengths as
# --system-len / --question-len, then requests in flight and output tokens).
WORKLOADS: dict[str, list[str]] = {
    "prefix": ["--num-groups", "4", "--prompts-per-group", "8", "--system-len", "2048"],
    "random": ["--num-groups", "32", "--prompts-per-group", "1", "--system-len", "1024"],
}
SERVE_COMMON = ["--question-len", "128", "--output-len", "128", "--concurrency", "16"]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def prefix_ttft(
    model: str | None,
    device: str,
    dtype: str,
    reps: int = 3,
    prefix: int = PREFIX_TOKENS,
    suffix: int = SUFFIX_TOKENS,
) -> dict[str, Any]:
    """Cold vs cached-prefix time to first token (see the module docstring)."""
    from radixkv.engine.engine import Engine
    from radixkv.engine.types import SamplingParams

    engine = Engine(model, device=device, dtype=dtype)
    vocab = engine.vocab_size
    gen = torch.Generator().manual_seed(11)
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)

    def tokens(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=gen).tolist()

    def timed(prompt: list[int]) -> tuple[float, int]:
        _sync(device)
        t0 = time.perf_counter()
        (out,) = engine.generate([prompt], one)
        _sync(device)
        return (time.perf_counter() - t0) * 1e3, out.cached_tokens

    timed(tokens(prefix + suffix))  # warm-up: kernels compiled, graphs captured, allocator grown
    cold, warm, hits = [], [], []
    for _ in range(reps):
        head = tokens(prefix)
        ms, _ = timed(head + tokens(suffix))
        cold.append(ms)
        ms, cached = timed(head + tokens(suffix))
        warm.append(ms)
        hits.append(cached)
    engine.check_memory()
    cold_ms, warm_ms = statistics.median(cold), statistics.median(warm)
    out = {
        "prefix_tokens": prefix, "suffix_tokens": suffix, "dtype": dtype,
        "cold_ms": cold, "warm_ms": warm, "cached_tokens": hits,
        "cold_median_ms": cold_ms, "warm_median_ms": warm_ms, "cut": cold_ms / warm_ms,
    }  # fmt: skip
    # A hit reuses whole pages of the prefix: at most one page short of it.
    out["ok"] = all(prefix - engine.config.cache.page_size < h <= prefix for h in hits)
    print(f"prefix ttft: cold {cold_ms:.1f} ms, cached {warm_ms:.1f} ms, cut {out['cut']:.1f}x "
          f"(hits {hits})", flush=True)  # fmt: skip
    return out


def serve_run(
    model: str | None,
    device: str,
    dtype: str,
    workload: str,
    compile_model: bool = False,
    shape: list[str] | None = None,
    timeout: float = 240.0,
) -> dict[str, Any]:
    """`radixkv serve` + `radixkv bench serve --workload shared-prefix` with `workload`'s shape
    (or `shape`, for small CPU runs); the client's summary and the wall time."""
    from radixkv.bench.serving.server_proc import LocalServer

    flags = ["--device", device, "--dtype", dtype]
    flags.append("--compile" if compile_model else "--no-compile")
    args = shape if shape is not None else WORKLOADS[workload] + SERVE_COMMON
    with tempfile.TemporaryDirectory() as tmp, LocalServer(model, flags, startup_timeout=300) as s:
        out_json = Path(tmp) / "serve.json"
        cmd = [sys.executable, "-m", "radixkv", "bench", "serve", "--base-url", s.url]
        cmd += ["--workload", "shared-prefix", *args, "--no-progress", "--json", str(out_json)]
        print("$", " ".join(cmd), flush=True)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        print(proc.stdout[-3000:], proc.stderr[-2000:] if proc.returncode else "", flush=True)
        summary = json.loads(out_json.read_text())["summary"] if out_json.exists() else {}
        return {
            "workload": workload, "model": model, "dtype": dtype, "rc": proc.returncode,
            "startup_s": s.startup_s, "bench_wall_s": time.perf_counter() - t0,
            "summary": summary, "ok": proc.returncode == 0 and bool(summary.get("completed")),
        }  # fmt: skip

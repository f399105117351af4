"""Which kernel path each dtype takes on this CPU: chosen once per build by a short measurement,
recorded beside the build, forced by environment variables.

bfloat16 products have up to three row-invariant paths (`gemm.cpp`): "fma" (f32 FMAs on widened
values), "dot" (VDPBF16PS on bf16 pairs) and "amx" (AMX tiles). Each keeps one reduction order
for every row count, but their orders differ, so a process must take one path for its whole life
(chosen when the module loads, before any weight is used). Which is fastest depends on the CPU,
not its vendor: VDPBF16PS runs at the FMA rate on AMD Zen 4 and at a quarter of it on Intel's
Sapphire Rapids, so the choice is measured, not looked up.

The measurement times every path on two products (a prefill-sized one, 192 rows, and a
decode-sized one, 4 rows over a weight larger than the caches) and keeps the seconds in
`bf16_gemm.json` in the build folder, so every later process on the machine takes the same path
without measuring. The rule is stable under noise: paths are taken in the order of
`PREFERENCE`, and a later one replaces the current choice only when it is at least `MARGIN`
times faster (the paths differ by 2x or more where they differ at all, so a noisy host does not
flip the choice, and with it the bits, from one build to the next).

$RADIXKV_BF16_GEMM=fma|dot|amx forces a path (one the CPU does not serve is an error);
$RADIXKV_AMX=0 keeps the tiles off altogether (GEMM and attention).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RECORD = "bf16_gemm.json"
PREFERENCE = ("amx", "dot", "fma")
MARGIN = 1.25
ENV = "RADIXKV_BF16_GEMM"


def choose(seconds: dict[str, float], available: list[str]) -> str:
    """The path `seconds` (measured time per path) makes the choice among `available`."""
    ranked = [p for p in PREFERENCE if p in available]
    best = ranked[0]
    for path in ranked[1:]:
        if seconds[path] * MARGIN < seconds[best]:
            best = path
    return best


def measure(module: Any, paths: list[str], repeats: int = 5) -> dict[str, float]:
    """Best-of-`repeats` seconds of the two probe products on each path, alternated call by call
    so a load on the host hits every path alike. Leaves the module on the first path."""
    import torch

    gen = torch.Generator().manual_seed(0)
    shapes = [(192, 1024, 1536), (4, 4096, 2048)]  # (rows, in features, out features)
    probes = []
    for m, k, n in shapes:
        w = (torch.randn(n, k, generator=gen) / k**0.5).to(torch.bfloat16)
        x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
        probes.append((x, module.gemm_pack(w), n))
    best = {p: [float("inf")] * len(probes) for p in paths}
    for rep in range(repeats + 1):
        for path in paths:
            module.set_bf16_gemm(path)
            for i, (x, packed, n) in enumerate(probes):
                t0 = time.perf_counter()
                module.gemm(x, packed, n, None)
                elapsed = time.perf_counter() - t0
                if rep:  # the first round warms up
                    best[path][i] = min(best[path][i], elapsed)
    module.set_bf16_gemm(paths[0])
    return {p: sum(times) for p, times in best.items()}


def _read(record: Path) -> dict[str, float]:
    try:
        data = json.loads(record.read_text())
        return {str(k): float(v) for k, v in data["seconds"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def select_bf16_gemm(module: Any, folder: Path) -> str:
    """Set and return this process's bfloat16 GEMM path ("" where there is none). The caller
    holds the build folder's lock (the record is written once, by one process)."""
    paths = [str(p) for p in module.bf16_gemm_paths()]
    if not paths:
        return ""
    forced = os.environ.get(ENV, "")
    if forced:
        if forced not in paths:
            raise ValueError(f"${ENV}={forced}: this CPU serves {', '.join(paths)}")
        module.set_bf16_gemm(forced)
        return forced
    record = folder / RECORD
    seconds = _read(record)
    missing = [p for p in paths if p not in seconds]
    if missing:
        seconds.update(measure(module, missing))
        record.write_text(json.dumps({"seconds": seconds}, indent=1) + "\n")
        log.info("bfloat16 GEMM paths measured (s): %s", seconds)
    path = choose(seconds, paths)
    module.set_bf16_gemm(path)
    return path


ISA_ENV = "RADIXKV_ISA"
# The builds: "avx512" compiles for this CPU (-march=native) on CPUs with AVX-512; "avx2" compiles
# the same kernels for AVX2 + FMA + F16C (-march=haswell, isa.h: AVX-512's operations on two
# 256-bit halves, the same bits as an AVX-512 CPU without AVX-512 BF16) for every x86-64 CPU
# from Haswell on. The flags each needs in /proc/cpuinfo:
ISA_FLAGS = {"avx512": ("avx512f", "avx512bw", "avx512vl"), "avx2": ("avx2", "fma", "f16c")}


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo), empty where there are none."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            line = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return set()
    return set(line.partition(":")[2].split())


def isa(flags: set[str] | None = None) -> str:
    """The build this process loads ("avx512", "avx2", or "" where neither serves the CPU):
    the widest the CPU has, or $RADIXKV_ISA (a build the CPU cannot run is an error)."""
    flags = cpu_flags() if flags is None else flags
    served = [name for name, need in ISA_FLAGS.items() if all(f in flags for f in need)]
    forced = os.environ.get(ISA_ENV, "")
    if forced:
        if forced not in served:
            have = ", ".join(served) or "neither avx512 nor avx2"
            raise ValueError(f"${ISA_ENV}={forced}: this CPU runs {have}")
        return forced
    return served[0] if served else ""


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or the machine type where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return os.uname().machine


def report(module: Any) -> dict[str, str]:
    """The kernel path each dtype took in this process, for benchmark JSON and logs."""
    if module is None:
        return {"cpu": cpu_model(), "kernels": "none (torch's)"}
    bf16 = str(module.bf16_gemm()) or "onednn"
    amx = bool(module.gemm_bf16_amx_supported())
    served = list(module.bf16_gemm_paths())  # "dot": built with AVX-512 BF16
    return {
        "cpu": cpu_model(),
        "kernels": isa() if module.gemm_f32_supported() else "none (torch's)",
        "float32_gemm": "fma" if module.gemm_f32_supported() else "onednn",
        "bfloat16_gemm": bf16,
        "bfloat16_attention": "amx" if amx else ("dpbf16" if "dot" in served else "fma"),
    }

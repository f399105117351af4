"""C++ CPU kernels, built on first use with torch's extension builder (g++ and ninja).

`decode_attention()` returns the one-query-per-request attention kernel of
`decode_attention.cpp`, or None where it cannot be built (no compiler, a non-x86 CPU without the
build tools, or `RADIXKV_CPU_KERNELS=0`); callers then fall back to gather + SDPA. The build
(about 20-50 s, once) lands under the RadixKV cache directory, in a folder named after the torch
version and this CPU's instruction-set flags (the code is compiled with -march=native), and is
reused by every later process on the same machine.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch

log = logging.getLogger(__name__)

DecodeKernel = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor
]
SOURCE = Path(__file__).with_name("decode_attention.cpp")


def _cpu_tag() -> str:
    """A short hash of the CPU's flags: a build made with -march=native is only reused on a CPU
    with the same instruction sets."""
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        pass
    return hashlib.sha1(flags.encode()).hexdigest()[:10]


def build_dir() -> Path:
    from radixkv.model.default import cache_root

    tag = f"torch{torch.__version__.split('+')[0]}-py{sys.version_info[0]}{sys.version_info[1]}"
    return cache_root().parent / "kernels" / f"{tag}-{_cpu_tag()}"


def _ensure_ninja_on_path() -> None:
    """torch's builder runs `ninja` from PATH; the pip `ninja` package keeps it in the venv."""
    if shutil.which("ninja"):
        return
    try:
        import ninja
    except ImportError:
        return
    os.environ["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"


@cache
def decode_attention() -> DecodeKernel | None:
    """The compiled kernel `(q [R,H,D], k [N,KV,D], v [N,KV,D], slots [R,W], lens [R], scale) →
    out [R,H,D]`, or None (logged once) where it is disabled or cannot be built."""
    if os.environ.get("RADIXKV_CPU_KERNELS", "1") == "0":
        return None
    try:
        from torch.utils.cpp_extension import load

        _ensure_ninja_on_path()
        path = build_dir()
        path.mkdir(parents=True, exist_ok=True)
        flags = ["-O3", "-fopenmp"]
        if os.uname().machine in ("x86_64", "AMD64"):
            flags.append("-march=native")
        module = load(
            name="radixkv_decode_attention",
            sources=[str(SOURCE)],
            extra_cflags=flags,
            build_directory=str(path),
            verbose=False,
        )
    except Exception as exc:  # any build failure means "use the fallback"
        log.warning("C++ decode attention unavailable (%s); using gather + SDPA", exc)
        return None
    fn: DecodeKernel = module.decode_attention
    return fn

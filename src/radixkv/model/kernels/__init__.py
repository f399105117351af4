"""C++ CPU kernels, built on first use with torch's extension builder (g++ and ninja).

- `decode_attention()`: one query per request attending to its context's K/V read in place from
  the pool (`decode_attention.cpp`); the fallback is gather + SDPA.
- `extend_attention()`: the new tokens of prefill chunks attending causally (optionally within a
  sliding window) to their contexts' K/V read in place from the pool, flash-attention style
  (`extend_attention.cpp`); the fallback is gather + SDPA.
- `gemm(dtype)`: x W^T for any number of rows with a reduction order that does not depend on the
  row count, from a weight repacked in blocks of 16 outputs (`gemm.cpp`, AVX-512 / AVX-512 BF16);
  the fallback is oneDNN.

- `deltanet()`: the gated delta rule (Qwen3.5, Qwen3-Next) token by token over runs of sequences
  and decode rows alike, one fixed order per token (`deltanet.cpp`); the fallback is the chunked
  torch form of `radixkv.model.families.deltanet` ($RADIXKV_DELTANET_KERNEL=0 forces it).
- `pointwise()`: RMSNorm (and its (1 + w) form), SiLU * up, GELU (tanh) * up and RoPE
  (`pointwise.cpp`) with one fixed arithmetic per row, called by the eager and the compiled
  model alike.
- `DecoderStack` (`stack.cpp`): a Llama-family model's layers in one call that makes the very
  kernel calls of the eager layers, in order (radixkv.model.nn.native_stack).

On CPUs with AMX, bfloat16 attention and GEMMs run on AMX tiles (`attn_amx.h`, `gemm_amx.h`);
`RADIXKV_AMX=0` keeps a process on the AVX-512 kernels (other bits, the same invariance). Without
AMX, the bfloat16 GEMM runs VDPBF16PS or FMAs on widened values, whichever a measurement at build
time found faster on this CPU (`paths.py`; `RADIXKV_BF16_GEMM` forces one).

The two attention kernels share one reduction order (keys in blocks at absolute positions, see
`decode_canon.h`), so a token's attention output is the same bits whether it was computed in a
prefill chunk of any size, after a cached prefix, or in a decode step.

Each returns None where the kernels cannot be built (no compiler, `RADIXKV_CPU_KERNELS=0`) or the
CPU lacks the instructions; callers then take the fallback. The build (about 30-60 s, once) lands
under the RadixKV cache directory, in a folder named after the torch version, this CPU's
instruction-set flags (the code is compiled with -march=native) and a hash of the sources, and is
reused by every later process on the same machine. Processes take turns on a folder through an
`fcntl.flock` (`build_lock`), which the OS releases when its holder dies: a killed build delays
the next process by nothing, and the lock file torch's builder left behind is removed at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import torch

from radixkv.model.kernels import paths

log = logging.getLogger(__name__)

DecodeKernel = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, float],
    torch.Tensor,
]
SOURCES = [
    Path(__file__).with_name(name)
    for name in (
        "bindings.cpp",
        "decode_attention.cpp",
        "deltanet.cpp",
        "extend_attention.cpp",
        "gemm.cpp",
        "pointwise.cpp",
        "stack.cpp",
    )
]


def _cpu_tag() -> str:
    """A short hash of the CPU's flags: a build made with -march=native is only reused on a CPU
    with the same instruction sets."""
    flags = " ".join(sorted(paths.cpu_flags()))
    return hashlib.sha1(flags.encode()).hexdigest()[:10]


def _source_tag() -> str:
    """A short hash of the kernel sources and headers and of where they are: another version of
    them builds in its own folder instead of rebuilding over this one (an upgrade), and so does
    another checkout of the same version (torch's builder writes the sources' absolute paths
    into its build file, so two checkouts sharing a folder would rebuild it in turn)."""
    here = Path(__file__).parent
    digest = hashlib.sha1(str(here.resolve()).encode())
    for path in sorted(here.glob("*.[ch]*")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:8]


def build_dir() -> Path:
    from radixkv.model.checkpoints.default import cache_root

    tag = f"torch{torch.__version__.split('+')[0]}-py{sys.version_info[0]}{sys.version_info[1]}"
    name = f"{tag}-{_cpu_tag()}-{_source_tag()}"
    build = paths.isa()
    return cache_root().parent / "kernels" / (f"{name}-{build}" if build == "avx2" else name)


LOCK_NAME = "radixkv-build.lock"


@contextlib.contextmanager
def build_lock(path: Path) -> Iterator[None]:
    """Hold the build folder `path` exclusively: an `fcntl.flock` on `path/radixkv-build.lock`,
    waited for while another live process holds it (a build takes 1-5 minutes).

    The OS drops a flock when its holder exits, however it exits (SIGKILL included), so a
    killed build never blocks the next process. Invariant while held: no live RadixKV process
    builds in `path`, so torch's own lock file there (`lock`, created by its builder and waited
    on for as long as it exists) was left by a killed build and is removed, with a warning."""
    path.mkdir(parents=True, exist_ok=True)
    with open(path / LOCK_NAME, "a") as held:  # never deleted: the flock lives on its inode
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process building the C++ kernels in %s", path)
            fcntl.flock(held, fcntl.LOCK_EX)
        try:
            baton = path / "lock"
            if baton.exists():
                log.warning("removing a kernel build lock left by a killed build: %s", baton)
                baton.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


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
def cpu_kernels() -> Any:
    """The built extension module, or None (logged once) where it is disabled or cannot be
    built."""
    if os.environ.get("RADIXKV_CPU_KERNELS", "1") == "0":
        return None
    try:
        from torch.utils.cpp_extension import load

        _ensure_ninja_on_path()
        path = build_dir()
        flags = ["-O3", "-fopenmp"]
        if os.uname().machine in ("x86_64", "AMD64"):
            # -march=haswell: AVX2 + FMA + F16C, the AVX-512 kernels on 256-bit halves (isa.h)
            flags.append("-march=haswell" if paths.isa() == "avx2" else "-march=native")
        with build_lock(path):
            module = load(
                name="radixkv_cpu_kernels",
                sources=[str(src) for src in SOURCES],
                extra_cflags=flags,
                build_directory=str(path),
                verbose=False,
            )
            # Inside the lock: the first process measures the bfloat16 paths and records them.
            bf16 = paths.select_bf16_gemm(module, path)
    except ValueError:  # a forced path this CPU does not serve: said, not hidden by a fallback
        raise
    except Exception as exc:  # any build failure means "use the fallbacks"
        log.warning("C++ CPU kernels unavailable (%s); using torch's kernels", exc)
        return None
    log.info("C++ CPU kernels: bfloat16 GEMM path %s", bf16 or "none")
    return module


def kernel_paths() -> dict[str, str]:
    """The CPU model and the kernel path each dtype takes in this process (for reports)."""
    return paths.report(cpu_kernels())


def decode_attention() -> DecodeKernel | None:
    """`(q [R,H,D], k [N,KV,D], v [N,KV,D], slots [R,W], lens [R], window, scale) → out
    [R,H,D]`: row r's first lens[r] slots are its whole context (window 0: none)."""
    module = cpu_kernels()
    if module is None:
        return None
    fn: DecodeKernel = module.decode_attention
    return fn


ExtendKernel = Callable[..., torch.Tensor]


def extend_attention() -> ExtendKernel | None:
    """`(q [T,H,D], k, v [N,KV,D], slots, ctx_start, q_start, new_len, prefix, window, scale)
    → out [T,H,D]`: see `extend_attention.cpp` for the argument contract
    ($RADIXKV_EXTEND_KERNEL=0 turns it off)."""
    if os.environ.get("RADIXKV_EXTEND_KERNEL", "1") == "0":
        return None
    module = cpu_kernels()
    if module is None or not module.extend_attention_supported():
        return None
    fn: ExtendKernel = module.extend_attention
    return fn


def gemm(dtype: torch.dtype) -> Any:
    """The module whose `gemm_pack(w)` / `gemm(x, packed, n, bias_f32)` serve `dtype` on this
    CPU, or None."""
    module = cpu_kernels()
    if module is None:
        return None
    if dtype == torch.float32 and module.gemm_f32_supported():
        return module
    if dtype == torch.bfloat16 and module.gemm_bf16_supported():
        return module
    return None


def pointwise() -> Any:
    """The module whose `rms_norm`, `rms_norm_1p`, `silu_mul`, `gelu_tanh_mul` and `rope` serve
    the decoder layers, or None."""
    return cpu_kernels()


def deltanet() -> Any:
    """The module whose `gated_delta_rule` serves the DeltaNet layers, or None (not built, or
    $RADIXKV_DELTANET_KERNEL=0)."""
    if os.environ.get("RADIXKV_DELTANET_KERNEL", "1") == "0":
        return None
    return cpu_kernels()

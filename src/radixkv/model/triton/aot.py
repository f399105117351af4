"""Compile the kernels for a GPU without one: Triton's front end, its NVIDIA passes and the ptxas
it ships, for a target named by hand (sm_90 = Hopper: H100 / H200). What a launch compiles on the
device, short of the driver's load, so a kernel that does not build is found on any machine.

    python -m radixkv.model.triton.aot [--arch 90] [--dtype bfloat16] [--head-dim 128] [--group 4]

prints, per kernel, its shared memory, whether it uses Hopper's warp-group MMA and whether its
PTX holds an FMA.
Needs a process without TRITON_INTERPRET=1 (interpreted kernels have nothing to compile).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

_TYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def _signature(fn: Any, types: dict[str, str]) -> dict[str, str]:
    return {name: types.get(name, "constexpr") for name in fn.arg_names}


def _aligned(fn: Any, names: list[str]) -> dict[tuple[int, ...], list[list[Any]]]:
    """16-divisibility of pointers and row strides, as a launch on torch tensors sees them."""
    return {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in names}


def _summary(compiled: Any) -> dict[str, Any]:
    ttgir = compiled.asm["ttgir"]
    return {
        "shared_bytes": compiled.metadata.shared,
        "warp_group_mma": "warp_group_dot" in ttgir,
        # With contraction off, a 16-bit build has no FMA at all (float32's IEEE dot has its own).
        "fma": "fma.rn" in compiled.asm["ptx"],
    }


def compile_kernels(
    arch: int = 90, dtype: str = "bfloat16", head_dim: int = 128, group: int = 4, page: int = 1
) -> dict[str, Any]:
    """Both kernels for sm_{arch}, with the launchers' constants and launch options."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from radixkv.model.triton import kernels
    from radixkv.model.triton.paged_attention import (
        BLOCK_M,
        BLOCK_N,
        BLOCK_R,
        KV_SPLIT,
        launch_config,
    )

    if not isinstance(kernels.attn_partials, triton.runtime.JITFunction):
        raise RuntimeError("the kernels are interpreted (TRITON_INTERPRET=1): nothing to build")
    target = GPUTarget("cuda", arch, 32)
    opts = launch_config(head_dim)
    elem = _TYPES[dtype]
    block_d = max(16, 1 << (head_dim - 1).bit_length())
    fn = kernels.attn_partials
    ptrs = {n: f"*{elem}" for n in ("Q", "K", "V")}
    ptrs |= {n: "*i64" for n in ("Table", "SeqLens", "QStart")}  # the ForwardBatch's
    ptrs |= {n: "*fp32" for n in ("MPart", "LPart", "OPart")}
    strides = ["stride_qt", "stride_qh", "stride_ks", "stride_kh", "stride_vs", "stride_vh", "H"]
    ints = ["num_requests", "n_parts", "window", "stride_table", *strides]
    types = {**ptrs, **dict.fromkeys(ints, "i32"), "qk_scale": "fp32"}
    consts = {"G": group, "D": head_dim, "BLOCK_D": block_d, "BLOCK_M": BLOCK_M,
              "BLOCK_N": BLOCK_N, "SPLIT": KV_SPLIT, "PAGE": page, "UPCAST": False,
              "DOT_PRECISION": "ieee" if dtype == "float32" else "tf32"}  # fmt: skip
    src = ASTSource(fn, _signature(fn, types), consts, _aligned(fn, [*ptrs, *strides]))
    partials = triton.compile(src, target=target, options=opts)
    fn = kernels.attn_combine
    types = {"MPart": "*fp32", "LPart": "*fp32", "OPart": "*fp32", "Out": f"*{elem}"}
    types |= dict.fromkeys(("num_rows", "n_parts", "stride_ot", "stride_oh", "H"), "i32")
    consts = {"D": head_dim, "BLOCK_D": block_d, "BLOCK_R": BLOCK_R}
    src = ASTSource(fn, _signature(fn, types), consts, _aligned(fn, ["MPart", "LPart", "OPart"]))
    combine = triton.compile(src, target=target, options=opts)
    return {"arch": arch, "partials": _summary(partials), "combine": _summary(combine)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("--dtype", default="bfloat16", choices=sorted(_TYPES))
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--page", type=int, default=1)
    a = p.parse_args(argv)
    print(json.dumps(compile_kernels(a.arch, a.dtype, a.head_dim, a.group, a.page)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

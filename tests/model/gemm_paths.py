"""Every row-invariant GEMM path the CPU serves for a dtype, one after another in one process.

A serving process takes one bfloat16 path for its life (`radixkv.model.kernels.paths`); a test
may switch between them, since each product reads the path when it runs and packing does not
depend on it. `each_path` restores the process's own path afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch


def gemm_module(dtype: torch.dtype) -> Any:
    """The kernel module serving `dtype`, or a skip."""
    from radixkv.model.kernels import gemm

    mod = gemm(dtype)
    if mod is None:
        pytest.skip(f"no GEMM kernel for {dtype} on this CPU")
    return mod


def each_path(mod: Any, dtype: torch.dtype) -> Iterator[str]:
    """Yields each path name with the module switched to it (float32 has one: "fma")."""
    if dtype != torch.bfloat16:
        yield "fma"
        return
    own = str(mod.bf16_gemm())
    try:
        for path in mod.bf16_gemm_paths():
            mod.set_bf16_gemm(path)
            yield str(path)
    finally:
        mod.set_bf16_gemm(own)

"""Linear layers with weights prepacked for the CPU GEMM library (oneDNN), and their custom op.

`F.linear` on CPU reads a plain row-major weight through MKL's sgemm, which for the few rows of a
decode step (M = number of running requests) reaches about a third of the memory bandwidth. oneDNN
can reorder a weight once, at load time, into its blocked layout; the same product then streams
the weight at close to full bandwidth, in float32 and in bfloat16 (measured in docs/vllm.md and
with `radixkv.model.microbench`: 30 layers' projections at M = 8 take about half the
time). The packed tensor replaces the plain one (no second copy of the weights).

Decode steps (at most SMALL_M rows) take a second copy of the weight, repacked for the C++ kernel
of `radixkv.model.kernels.small_gemm` where this CPU has it (AVX-512; bf16 also needs AVX-512
BF16): at such M it streams the weight 1.2x (float32) to 1.5x (bfloat16) faster than oneDNN
(`python -m radixkv.model.microbench --steps-ab` with RADIXKV_SMALL_GEMM=0 / 1). The copy costs
the weight's size again in memory ($RADIXKV_SMALL_GEMM=0 turns it off).

`PackedLinear.__call__` is the eager path. The compiled path (`radixkv.model.compiled`) cannot
trace an opaque oneDNN tensor, so it calls the `radixkv::packed_linear` custom op with an integer
handle into a process-wide registry; inductor treats the op as an extern call and fuses the
element-wise code around it.

Invariant: a handle, once issued, keeps pointing at the same PackedLinear for the life of the
process (entries are never reused), so a compiled graph that captured a handle stays valid.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import torch
import torch.nn.functional as F

# Weak references: a model that is dropped frees its weights; its handles then dangle (and are
# never reissued).
_REGISTRY: list[weakref.ref[PackedLinear]] = []
SMALL_M = 16  # rows up to which the small-GEMM kernel beats oneDNN (measured at 1, 8 and 16)


def can_pack(weight: torch.Tensor) -> bool:
    """oneDNN packing applies to CPU float32/bfloat16 weights when torch was built with it
    ($RADIXKV_PACK_WEIGHTS=0 turns it off, for before/after measurements)."""
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and os.environ.get("RADIXKV_PACK_WEIGHTS", "1") != "0"
    )


def _small_kernels(w: torch.Tensor) -> Any:
    """The small-GEMM kernels for this weight, or None (not CPU, shape not a multiple of 16,
    no kernel for the dtype on this CPU)."""
    if not can_pack(w) or w.shape[0] % 16 or (w.dtype == torch.bfloat16 and w.shape[1] % 2):
        return None
    from radixkv.model.kernels import small_gemm

    return small_gemm(w.dtype)


class PackedLinear:
    """y = x W^T + b with W [out, in] stored in whichever layout is fastest on its device.

    `batch_hint` is the row count oneDNN tunes the layout for (decode batches are small); any
    row count is accepted.
    """

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None = None, batch_hint: int = 8
    ) -> None:
        self.out_features, self.in_features = int(weight.shape[0]), int(weight.shape[1])
        self.dtype = weight.dtype
        self.bias = None if bias is None else bias.contiguous()
        self.packed = can_pack(weight)
        w = weight.contiguous()
        self.weight = torch.ops.mkldnn._reorder_linear_weight(w, batch_hint) if self.packed else w
        # The decode path's copy of W (see the module docstring); None where it does not apply.
        self.small: Any = None
        self.small_w: torch.Tensor | None = None
        self.small_bias: torch.Tensor | None = None
        kernels = _small_kernels(w)
        if kernels is not None:
            self.small = kernels
            self.small_w = kernels.small_gemm_pack(w)
            self.small_bias = None if bias is None else bias.float().contiguous()
        self.handle = len(_REGISTRY)
        _REGISTRY.append(weakref.ref(self))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.small is not None and x.numel() <= SMALL_M * self.in_features:
            lead = x.shape[:-1]
            x2 = x.reshape(-1, self.in_features).contiguous()
            y = self.small.small_gemm(x2, self.small_w, self.out_features, self.small_bias)
            return y.view(*lead, self.out_features)
        if self.packed:
            # oneDNN wants a contiguous 2-D input; leading dims are flattened and restored.
            lead = x.shape[:-1]
            x2 = x.reshape(-1, self.in_features).contiguous()
            y = torch.ops.mkldnn._linear_pointwise(x2, self.weight, self.bias, "none", [], "")
            return y.view(*lead, self.out_features)
        return F.linear(x, self.weight, self.bias)


# Registered through the low-level Library API rather than torch.library.custom_op: the latter
# wraps every call in autograd/aliasing checks (about 3x the dispatch cost, ~120 calls a step).
LIB = torch.library.Library("radixkv", "DEF")
LIB.define("packed_linear(Tensor x, int handle) -> Tensor")


def packed_linear(x: torch.Tensor, handle: int) -> torch.Tensor:
    """The registered PackedLinear `handle` applied to x (opaque to the compiler)."""
    return _lookup(handle)(x)


def _lookup(handle: int) -> PackedLinear:
    lin = _REGISTRY[handle]()
    if lin is None:
        raise RuntimeError(f"packed linear {handle} belongs to a model that was freed")
    return lin


def _packed_linear_fake(x: torch.Tensor, handle: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], _lookup(handle).out_features))


LIB.impl("packed_linear", packed_linear, "CompositeExplicitAutograd")
torch.library.register_fake("radixkv::packed_linear", _packed_linear_fake, lib=LIB)

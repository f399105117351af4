"""Linear layers served by one row-invariant GEMM, and their custom op.

Where the C++ kernels serve the weight's dtype on this CPU (AVX-512; bfloat16 also needs AVX-512
BF16 and an even in-feature count), the weight is repacked once into blocks of 16 outputs and
every product, a one-row decode step and a 2,048-row prefill chunk alike, runs through
`radixkv.model.kernels.gemm`: each output element is one f32 chain over k in increasing order
(on CPUs with AMX, bfloat16 weights whose K is a multiple of 32 take AMX tiles, in one fixed order
too), so a request's row is bit-identical whatever else shares its batch (the batch-invariant
matmul that "one answer per question" needs). Speeds against oneDNN: docs/determinism.md. The
repacked weight replaces the plain one (one copy).

Elsewhere (no kernels, other dtypes, $RADIXKV_CPU_KERNELS=0) the weight is prepacked for oneDNN
where torch has it, else kept plain for `F.linear`; those paths are fast but their per-row
result can depend on the row count.

`PackedLinear.__call__` is the eager path. The compiled path (`radixkv.model.nn.compiled`) cannot
trace an opaque packed tensor, so it calls the `radixkv::packed_linear` custom op with an integer
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

from radixkv.memory import hugepages

# Weak references: a model that is dropped frees its weights; its handles then dangle (and are
# never reissued).
_REGISTRY: list[weakref.ref[PackedLinear]] = []


def can_pack(weight: torch.Tensor) -> bool:
    """oneDNN packing applies to CPU float32/bfloat16 weights when torch was built with it
    ($RADIXKV_PACK_WEIGHTS=0 turns it off, for before/after measurements)."""
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and os.environ.get("RADIXKV_PACK_WEIGHTS", "1") != "0"
    )


def _gemm_kernels(w: torch.Tensor) -> Any:
    """The row-invariant GEMM module for this weight, or None (not CPU, no kernel for the dtype
    on this CPU, an odd in-feature count in bfloat16)."""
    if w.device.type != "cpu" or (w.dtype == torch.bfloat16 and w.shape[1] % 2):
        return None
    from radixkv.model.kernels import gemm

    return gemm(w.dtype)


def _fuses_silu(kernel: Any, w: torch.Tensor) -> bool:
    """Whether the fused gate/up product serves [gate; up] = w: bfloat16 on AMX tiles, K and
    the output count multiples of 32 (whole blocks of 16 per half)."""
    n, k = int(w.shape[0]), int(w.shape[1])
    return (
        w.dtype == torch.bfloat16
        and k % 32 == 0
        and n % 32 == 0
        and hasattr(kernel, "gemm_silu")
        and bool(kernel.gemm_bf16_amx())
    )


class PackedLinear:
    """y = x W^T + b with W [out, in] stored in whichever layout serves it best.

    `invariant` says whether each row's result is independent of the row count (the C++ GEMM
    serves this weight). `batch_hint` is the row count oneDNN tunes its layout for (the
    fallback only); any row count is accepted.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        batch_hint: int = 8,
        silu: bool = False,
    ) -> None:
        self.out_features, self.in_features = int(weight.shape[0]), int(weight.shape[1])
        self.dtype = weight.dtype
        self.bias = None if bias is None else bias.contiguous()
        w = weight.contiguous()
        self.kernel: Any = _gemm_kernels(w)
        self.packed = False
        # `silu`: W is [gate; up] and the caller wants silu(gate) * up. Where the AMX GEMM serves
        # the weight, the product computes it in its epilogue (the bits of the product followed
        # by silu_mul, one pass less over memory) and `self.silu` says so; elsewhere the caller
        # applies silu_mul to the plain product.
        self.silu = False
        self._n = self.out_features  # the product's outputs (2x out_features when fused)
        if self.kernel is not None:
            self.weight = self.kernel.gemm_pack(w)
            self.bias_f32 = None if bias is None else bias.float().contiguous()
            if silu and _fuses_silu(self.kernel, w):
                self._interleave_gate_up()
            self.weight = hugepages.copy_of(self.weight)  # streamed every step: fewer TLB misses
        else:
            self.packed = can_pack(w)
            self.weight = (
                torch.ops.mkldnn._reorder_linear_weight(w, batch_hint) if self.packed else w
            )
        self.handle = len(_REGISTRY)
        _REGISTRY.append(weakref.ref(self))

    def _interleave_gate_up(self) -> None:
        """Reorder the packed blocks of 16 outputs (and the bias) as gate block 0, up block 0,
        gate block 1, ...: the fused kernel's tile pairs are then a gate block and its up block."""
        half, shape = self.out_features // 2, self.weight.shape
        pairs = self.weight.view(2, shape[0] // 2, -1).transpose(0, 1)
        self.weight = pairs.contiguous().view(shape)
        if self.bias_f32 is not None:
            self.bias_f32 = self.bias_f32.view(2, half // 16, 16).transpose(0, 1).reshape(-1)
        self.silu, self.out_features = True, half

    @property
    def product_outputs(self) -> int:
        """The GEMM's output count: out_features, or both halves when SiLU is fused in."""
        return self._n

    @property
    def invariant(self) -> bool:
        return self.kernel is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is None and not self.packed:
            return F.linear(x, self.weight, self.bias)
        # Both kernels want a contiguous 2-D input; leading dims are flattened and restored.
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).contiguous()
        if self.silu:
            y = self.kernel.gemm_silu(x2, self.weight, self._n, self.bias_f32)
        elif self.kernel is not None:
            y = self.kernel.gemm(x2, self.weight, self.out_features, self.bias_f32)
        else:
            y = torch.ops.mkldnn._linear_pointwise(x2, self.weight, self.bias, "none", [], "")
        return y.view(*lead, self.out_features)


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

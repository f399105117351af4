"""Running the kernels on the CPU, under Triton's interpreter.

Triton chooses between compiling and interpreting when `@triton.jit` decorates a function, its
own library functions (`tl.sum`, `tl.max`, `tl.zeros`) included: TRITON_INTERPRET=1 must be set
before `triton` is first imported. Then every kernel of the process runs on the host with numpy
(CPU tensors in and out); without it CUDA tensors take the compiled kernels. The test suite sets
it where no GPU is present (tests/conftest.py).
"""

from __future__ import annotations

import numpy as np


def interpreting() -> bool:
    """Whether Triton runs kernels under its interpreter in this process."""
    from triton import knobs

    return bool(knobs.runtime.interpret)


def index_fix() -> None:
    """Triton 3.6's interpreter converts its 1-element scalar arrays with int(), which numpy
    >= 2.4 refuses (triton-lang/triton#9171, fixed upstream after 3.6), so a loop bound read from
    memory fails. Applied only where numpy refuses, once; it acts only inside interpreted
    launches (the interpreter restores the attribute after each one)."""
    from triton.runtime import interpreter

    try:
        int(np.array([1]))  # type: ignore[call-overload,unused-ignore]
        return
    except TypeError:
        pass
    if getattr(interpreter, "_radixkv_index_fix", False):
        return
    original = interpreter._patch_lang_tensor

    def patched(tensor: object, scope: object) -> None:
        original(tensor, scope)
        scope.set_attr(  # type: ignore[attr-defined]
            tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0])
        )

    interpreter._patch_lang_tensor = patched
    interpreter._radixkv_index_fix = True

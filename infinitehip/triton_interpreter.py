"""Workarounds for Triton 3.6 interpreter bugs (TRITON_INTERPRET=1, the CPU test path), shared by our kernels."""

from __future__ import annotations

import triton
import triton.language as tl


def fix_interpreter() -> None:
    """Work around two Triton 3.6 interpreter bugs the kernels hit (TRITON_INTERPRET=1 only).

    - Scalars are held as 1-element arrays and converted with `int(array)`, which numpy >= 2.4 rejects,
      so loaded key counts cannot bound `range` loops (triton-lang/triton#9171, fixed upstream the same
      way: take the array's single element).
    - `tl.dot` multiplies bf16 operands as their raw uint16 storage; widen them to fp32 first (exact).

    Idempotent (guarded by a marker on the patched functions); compiled kernels are untouched.
    """
    try:
        import numpy as np
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover
        return
    original_patch = getattr(interpreter, "_patch_lang_tensor", None)
    if original_patch is not None and not getattr(original_patch, "_infinitehip_fix", False):

        def patch_lang_tensor(tensor, scope):
            original_patch(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

        patch_lang_tensor._infinitehip_fix = True
        interpreter._patch_lang_tensor = patch_lang_tensor

    builder_cls = getattr(interpreter, "InterpreterBuilder", None)
    original_dot = getattr(builder_cls, "create_dot", None)
    if original_dot is not None and not getattr(original_dot, "_infinitehip_fix", False):

        def widen_bf16(x):
            if x.dtype.scalar != tl.bfloat16:
                return x
            data = (x.data.astype(np.uint32) << 16).view(np.float32)
            return interpreter.TensorHandle(data, tl.float32)

        def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
            return original_dot(self, widen_bf16(a), widen_bf16(b), d, input_precision, max_num_imprecise_acc)

        create_dot._infinitehip_fix = True
        builder_cls.create_dot = create_dot


def fix_interpreter_if_active() -> None:
    if triton.knobs.runtime.interpret:
        fix_interpreter()

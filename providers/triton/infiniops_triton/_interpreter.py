"""Fixes to the Triton 3.6 interpreter (its numpy emulation), so that CPU runs compute what the GPU computes.

Applied by the provider hook only under the interpreter switch (`interpreting_on_cpu`), once per process,
and by tests/triton_interp/conftest.py (the same function):

1. numpy >= 2.4 refuses ``int()`` of the one-element arrays the interpreter holds scalars in, so a
   ``range(n)`` over a runtime bound fails: ``__index__`` uses ``.item()``.
2. ``tl.dot`` on bfloat16 multiplies the raw uint16 bit patterns: bfloat16 operands are widened first.
3. float32 -> bfloat16 casts (and stores) truncate: they round to nearest even, as the GPU does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["patch_interpreter"]


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16 bit patterns (NaN stays a quiet NaN)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    quiet_nan = (bits >> np.uint32(16)) | np.uint32(0x40)
    return np.where(np.isnan(values), quiet_nan, rounded).astype(np.uint16)


def patch_interpreter() -> None:
    """Install the three fixes into ``triton.runtime.interpreter`` (idempotent; affects this process only)."""
    import triton.language as tl
    from triton.runtime import interpreter as interp

    builder = interp.InterpreterBuilder
    if getattr(builder, "_infiniops_patched", False):
        return
    patch_tensor, cast_impl, create_dot = interp._patch_lang_tensor, builder.cast_impl, builder.create_dot

    def _patch_lang_tensor(tensor: Any, scope: Any) -> None:
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    def _cast_impl(self: Any, src: Any, dst_type: Any) -> Any:
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return interp.TensorHandle(_f32_to_bf16(src.data), tl.bfloat16)
        return cast_impl(self, src, dst_type)

    def _create_dot(self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any) -> Any:
        a, b = (interp.TensorHandle(_bf16_to_f32(t.data), tl.float32) if t.dtype.scalar == tl.bfloat16 else t
                for t in (a, b))
        return create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    interp._patch_lang_tensor = _patch_lang_tensor
    builder.cast_impl = _cast_impl
    builder.create_dot = _create_dot
    builder._infiniops_patched = True

"""Add as one Triton kernel: ``out = input + alpha * other`` with broadcasting and in place (``torch.add``).

The launcher expands both inputs to the output shape (a broadcast dimension gets stride 0), drops size-1
dimensions and merges the dimensions that are contiguous in all three tensors, so a same-shape contiguous
add is a flat vectorized 1-D copy loop and ``[T, H] + [H]`` is 2-D. The kernel walks ``BLOCK`` flat output
elements per program and turns the flat index into up to 4 coordinates (``NDIM`` is a constexpr: the
1-D case does no division). More than 4 dimensions left after merging are looped over on the host.
In place is safe: each element is read and written by the same program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infiniops_py import Capability, Implementation, OneOf
from infiniops_triton._common import PRIORITY, base_constraints

__all__ = ["IMPLEMENTATIONS", "add"]

MAX_KERNEL_DIMS = 4
_BLOCK = 4096  # elements per program: 16 per thread at 8 warps (two 16-byte vectors in 16-bit dtypes)
_NUM_WARPS = 8


@triton.jit
def _add_kernel(
    A,  # *dtype input, `sa*` strides over the (up to) 4 merged output dims
    B,  # *dtype other, broadcast dims have stride 0
    OUT,  # *dtype output (may be A itself)
    numel,
    alpha,
    size1, size2, size3,  # sizes of merged dims 1..3 (dim 0's size is implied by numel)
    sa0, sa1, sa2, sa3,
    sb0, sb1, sb2, sb3,
    so0, so1, so2, so3,
    NDIM: tl.constexpr,
    WIDE: tl.constexpr,  # int64 index arithmetic (a tensor spans 2**31 elements or more)
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if WIDE:
        pid = pid.to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    if NDIM == 1:
        pa = offs * sa3
        pb = offs * sb3
        po = offs * so3
    else:
        i3 = offs % size3
        rest = offs // size3
        pa = i3 * sa3
        pb = i3 * sb3
        po = i3 * so3
        if NDIM > 2:
            i2 = rest % size2
            rest = rest // size2
            pa += i2 * sa2
            pb += i2 * sb2
            po += i2 * so2
            if NDIM > 3:
                i1 = rest % size1
                rest = rest // size1
                pa += i1 * sa1
                pb += i1 * sb1
                po += i1 * so1
        pa += rest * sa0
        pb += rest * sb0
        po += rest * so0
    a = tl.load(A + pa, mask=mask).to(tl.float32)
    b = tl.load(B + pb, mask=mask).to(tl.float32)
    tl.store(OUT + po, (a + alpha * b).to(OUT.dtype.element_ty), mask=mask)


def _merge_dims(shape: tuple[int, ...], strides: list[tuple[int, ...]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge neighbours contiguous in every tensor: (sizes, strides per tensor)."""
    sizes: list[int] = []
    merged: list[list[int]] = [[] for _ in strides]
    for d, n in enumerate(shape):
        if n == 1:
            continue
        if sizes and all(m[-1] == s[d] * n for m, s in zip(merged, strides)):
            sizes[-1] *= n
            for m, s in zip(merged, strides):
                m[-1] = s[d]
            continue
        sizes.append(n)
        for m, s in zip(merged, strides):
            m.append(s[d])
    if not sizes:
        return [1], [[0] for _ in strides]
    return sizes, merged


def _kernel_slots(values: list[int], fill: int) -> list[int]:
    """Place per-dim values in the kernel's 4 slots: the outermost dim in slot 0, the others right-aligned
    (a 1-D problem uses slot 3 only)."""
    if len(values) == 1:
        return [fill] * (MAX_KERNEL_DIMS - 1) + values
    return [values[0], *[fill] * (MAX_KERNEL_DIMS - len(values)), *values[1:]]


def _launch(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, alpha: float) -> None:
    sizes, (sa, sb, so) = _merge_dims(tuple(out.shape), [a.stride(), b.stride(), out.stride()])
    if len(sizes) > MAX_KERNEL_DIMS:  # rare: only non-mergeable strided views of rank >= 5
        for i in range(out.shape[0]):
            _launch(a[i], b[i], out[i], alpha)
        return
    ndim = len(sizes)
    numel = out.numel()
    span = max(sum((n - 1) * st for n, st in zip(sizes, strides)) for strides in (sa, sb, so))
    sizes, sa, sb, so = (_kernel_slots(v, fill) for v, fill in ((sizes, 1), (sa, 0), (sb, 0), (so, 0)))
    wide = max(numel, span + 1) >= 2**31
    _add_kernel[(triton.cdiv(numel, _BLOCK),)](
        a, b, out, numel, alpha, sizes[1], sizes[2], sizes[3], *sa, *sb, *so,
        NDIM=ndim, WIDE=wide, BLOCK=_BLOCK, num_warps=_NUM_WARPS,
    )


def add(input: torch.Tensor, other: torch.Tensor, alpha: float, out: torch.Tensor) -> torch.Tensor:
    """``out = input + alpha * other`` in fp32, rounded once to the dtype (``torch.add``).

    Args:
        input, other: float16/bfloat16/float32 tensors broadcastable to ``out.shape``, any strides.
        alpha: multiplier of `other`.
        out: the broadcast shape, same dtype, no zero strides on dimensions of size > 1; may be `input`.

    Returns:
        `out`.
    """
    if out.numel() == 0:
        return out
    _launch(input.expand(out.shape), other.expand(out.shape), out, float(alpha))
    return out


IMPLEMENTATIONS = [
    Implementation(
        "add", "triton", "triton.add",
        Capability(*base_constraints(), OneOf("dtype", ("float16", "bfloat16", "float32"))),
        PRIORITY, add,
    ),
]

"""Add as one Triton kernel: ``out = input + alpha * other`` with broadcasting and in place (``torch.add``).

The launcher expands both inputs to the output shape (a broadcast dimension gets stride 0), drops size-1
dimensions and merges the dimensions that are contiguous in all three tensors, so a same-shape contiguous
add is a flat vectorized 1-D copy loop and ``[T, H] + [H]`` is 2-D. The kernel walks ``BLOCK`` flat output
elements per program and turns the flat index into up to 4 coordinates (``NDIM`` is a constexpr: the
1-D case does no division). More than 4 dimensions left after merging are looped over on the host.
In place is safe: each element is read and written by the same program.

Same-shape contiguous operands (the residual adds of a model, in place or not) take a flat kernel with no
index math at all: ``BLOCK`` elements per program as 16-byte vectors, loads marked evict-first (streamed,
never reused), no mask when ``BLOCK`` divides the size. Above `TUNE_MIN_NUMEL` elements it autotunes among
a few block sizes, warp counts and eviction hints once per power-of-two size class (restoring `out`, so in
place stays correct); smaller adds, and the interpreter, use one configuration.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infiniops_py import Capability, Implementation, OneOf
from infiniops_triton._common import INTERPRET, PRIORITY, base_constraints, cdiv
from infiniops_triton._fastlaunch import Launcher
from infiniops_triton._launch import Tuned

__all__ = ["IMPLEMENTATIONS", "add"]

MAX_KERNEL_DIMS = 4
TUNE_MIN_NUMEL = 1 << 24  # flat adds this large autotune (once per size class); smaller ones use _FLAT
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


@triton.jit
def _add_flat_kernel(
    A,  # *dtype input, contiguous
    B,  # *dtype other, contiguous, same shape
    OUT,  # *dtype output, contiguous (may be A itself)
    numel,
    alpha,
    size_class,  # numel.bit_length(): the autotuning key only
    WIDE: tl.constexpr,  # int64 offsets (2**31 elements or more)
    EVEN: tl.constexpr,  # BLOCK divides numel: no mask
    EVICT: tl.constexpr,  # eviction policy of the loads ("" or "evict_first")
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if WIDE:
        pid = pid.to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        a = tl.load(A + offs, eviction_policy=EVICT)
        b = tl.load(B + offs, eviction_policy=EVICT)
        tl.store(OUT + offs, (a.to(tl.float32) + alpha * b.to(tl.float32)).to(OUT.dtype.element_ty))
    else:
        mask = offs < numel
        a = tl.load(A + offs, mask=mask, eviction_policy=EVICT)
        b = tl.load(B + offs, mask=mask, eviction_policy=EVICT)
        tl.store(OUT + offs, (a.to(tl.float32) + alpha * b.to(tl.float32)).to(OUT.dtype.element_ty), mask=mask)


def _flat_config(block: int, warps: int, evict: str) -> triton.Config:
    return triton.Config({"BLOCK": block, "EVICT": evict}, num_warps=warps)


_FLAT = _flat_config(4096, 8, "evict_first")  # 16 elements per thread: two 16-byte vectors per operand
_FLAT_CANDIDATES = (_FLAT, _flat_config(4096, 8, ""), _flat_config(8192, 8, "evict_first"),
                    _flat_config(2048, 4, "evict_first"))
_even = triton.heuristics({"EVEN": lambda args: args["numel"] % args["BLOCK"] == 0})
_add_flat_tuned = Tuned(triton.autotune(list(_FLAT_CANDIDATES), key=["size_class", "WIDE"],
                                        restore_value=["OUT"])(_even(_add_flat_kernel)))
_add_flat_fixed = _even(_add_flat_kernel)
_MAX_FLAT_BLOCK = max(c.kwargs["BLOCK"] for c in _FLAT_CANDIDATES)


_ADD = Launcher(_add_kernel)
_ADD_FLAT = Launcher(_add_flat_fixed)


def _launch_flat(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, alpha: float) -> None:
    numel = out.numel()
    args = (a, b, out, numel, alpha, numel.bit_length())
    wide = numel + 2 * _MAX_FLAT_BLOCK >= 2**31  # the last block's offsets too
    if numel >= TUNE_MIN_NUMEL and not INTERPRET:
        _add_flat_tuned.launch((args[-1], wide, out.dtype), lambda meta: (cdiv(numel, meta["BLOCK"]),), *args,
                               WIDE=wide)
        return
    block = _FLAT.kwargs["BLOCK"]
    _ADD_FLAT((cdiv(numel, block),), *args, WIDE=wide, BLOCK=block, EVICT=_FLAT.kwargs["EVICT"],
              num_warps=_FLAT.num_warps)


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
    _ADD((cdiv(numel, _BLOCK),),
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
    if (input.shape == other.shape == out.shape and input.is_contiguous() and other.is_contiguous()
            and out.is_contiguous()):
        _launch_flat(input, other, out, float(alpha))
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

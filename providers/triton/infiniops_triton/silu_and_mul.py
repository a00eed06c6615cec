"""SiluAndMul as one Triton kernel: ``out = silu(x[:, :d]) * x[:, d:]`` (vLLM ``silu_and_mul``).

A program reads ``BLOCK`` gate columns and the ``BLOCK`` up columns ``d`` further along the same row of
``x`` ``[T, 2d]``, computes ``gate / (1 + exp(-gate))`` in fp32, rounds it to the dtype (as ``F.silu`` does),
multiplies by ``up`` in fp32 and stores the product rounded once. The grid is rows x column blocks, so a
decode step (one to a few dozen rows of a few thousand columns) still spreads over several programs, and
each program moves 16-byte vectors (``BLOCK`` a power of two, the columns contiguous).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infiniops_py import Between, Capability, Implementation, OneOf
from infiniops_triton._common import PRIORITY, base_constraints, cdiv, next_power_of_2, pdl, pdl_start
from infiniops_triton._fastlaunch import Launcher

__all__ = ["IMPLEMENTATIONS", "silu_and_mul"]

MAX_D = 65535 * 1024  # the grid's second dimension holds at most 65535 column blocks of _BLOCK
_BLOCK = 1024  # columns per program: 8 per thread at 4 warps (one 16-byte vector of a 16-bit dtype)


@triton.jit
def _silu_and_mul_kernel(
    X,  # *dtype [T, 2d] input, rows `stride_x` apart, unit column stride: gate columns, then up columns
    OUT,  # *dtype [T, d] output, rows `stride_o` apart
    D,  # d: the output width
    stride_x,
    stride_o,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    gate = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x + D + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(OUT.dtype.element_ty)  # F.silu's rounding to the dtype
    tl.store(OUT + row * stride_o + cols, (act.to(tl.float32) * up).to(OUT.dtype.element_ty), mask=mask)


_SILU_AND_MUL = Launcher(_silu_and_mul_kernel)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out = silu(x[:, :d]) * x[:, d:]`` row by row.

    Args:
        x: ``[T, 2d]`` float16/bfloat16/float32, unit last stride, any row stride.
        out: ``[T, d]``, same dtype, unit last stride.

    Returns:
        `out`.

    Raises:
        ValueError: ``d > MAX_D`` (the capability gates it first).
    """
    t, d = out.shape
    if d > MAX_D:
        raise ValueError(f"triton silu_and_mul: d {d} > {MAX_D}; use the torch provider")
    if t == 0 or d == 0:
        return out
    block = min(_BLOCK, next_power_of_2(d))
    num_warps = max(1, min(4, block // 256))
    _SILU_AND_MUL((t, cdiv(d, block)),
        x, out, d, x.stride(0), out.stride(0), BLOCK=block, num_warps=num_warps, **pdl(),
    )
    return out


IMPLEMENTATIONS = [
    Implementation(
        "silu_and_mul", "triton", "triton.silu_and_mul",
        Capability(
            *base_constraints(),
            OneOf("dtype", ("float16", "bfloat16", "float32")),
            Between("d", 1, MAX_D, fix="use the torch provider for wider rows"),
        ),
        PRIORITY, silu_and_mul,
    ),
]

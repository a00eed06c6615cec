"""RmsNorm and fused add + RmsNorm as Triton row kernels (vLLM ``rms_norm`` / ``fused_add_rms_norm``).

One program normalizes ``ROWS`` rows of ``[T, H]`` in one pass over memory: the whole row is held in
registers (``BLOCK = next_power_of_2(H)``), the variance is accumulated in fp32, the normalized value is
rounded to the input dtype and then multiplied by the weight (the contract's order). Small hidden sizes
pack several rows per program so every program moves a few kilobytes.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from infiniops_py import Between, Capability, Implementation, OneOf
from infiniops_triton._common import PRIORITY, base_constraints, cdiv, next_power_of_2, pdl, pdl_start
from infiniops_triton._fastlaunch import Launcher

__all__ = ["IMPLEMENTATIONS", "fused_add_rms_norm", "rms_norm"]

MAX_HIDDEN = 65536  # one row lives in registers: 64 fp32 values per thread at 32 warps
_ELEMS_PER_PROGRAM = 2048  # rows per program grow until a program holds this many elements


@triton.jit
def _rms_norm_kernel(
    X,  # *dtype [T, H] input, rows `stride_x` apart, unit column stride
    W,  # *dtype [H] weight
    Y,  # *dtype [T, H] output, rows `stride_y` apart
    T,
    H,
    stride_x,
    stride_y,
    eps,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < T) & (cols[None, :] < H)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / H + eps)
    w = tl.load(W + cols, mask=cols < H, other=0.0).to(tl.float32)
    y = (x * rstd[:, None]).to(Y.dtype.element_ty).to(tl.float32) * w[None, :]
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _fused_add_rms_norm_kernel(
    X,  # *dtype [T, H] input, overwritten with the normalized sum; rows `stride_x` apart
    R,  # *dtype [T, H] residual, overwritten with x + residual; rows `stride_r` apart
    W,  # *dtype [H] weight
    T,
    H,
    stride_x,
    stride_r,
    eps,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < T) & (cols[None, :] < H)
    x_ptrs = X + rows[:, None] * stride_x + cols[None, :]
    r_ptrs = R + rows[:, None] * stride_r + cols[None, :]
    x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32)
    s = (x + r).to(R.dtype.element_ty)  # the residual stream is rounded to the dtype, as in the reference
    tl.store(r_ptrs, s, mask=mask)
    s = s.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(s * s, axis=1) / H + eps)
    w = tl.load(W + cols, mask=cols < H, other=0.0).to(tl.float32)
    y = (s * rstd[:, None]).to(X.dtype.element_ty).to(tl.float32) * w[None, :]
    tl.store(x_ptrs, y.to(X.dtype.element_ty), mask=mask)


_RMS_NORM = Launcher(_rms_norm_kernel)
_FUSED_ADD_RMS_NORM = Launcher(_fused_add_rms_norm_kernel)


@functools.lru_cache(maxsize=4096)  # a model has a few hidden sizes and at most its maximum token count of rows
def _launch_params(rows: int, hidden: int) -> tuple[int, int, int]:
    """(ROWS, BLOCK, num_warps) for `rows` rows of `hidden` elements."""
    if hidden > MAX_HIDDEN:
        raise ValueError(f"triton rms_norm: hidden size {hidden} > {MAX_HIDDEN} (one row must fit in registers); "
                         "use the torch provider")
    block = next_power_of_2(hidden)
    per_program = max(1, min(_ELEMS_PER_PROGRAM // block, next_power_of_2(rows)))
    num_warps = min(32, max(4, per_program * block // 512))
    return per_program, block, num_warps


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> torch.Tensor:
    """``out = (x * rsqrt(mean(x^2) + eps)).to(x.dtype) * weight`` row by row (vLLM ``rms_norm``).

    Args:
        x: ``[T, H]`` float16/bfloat16/float32, unit last stride, any row stride.
        weight: ``[H]``, same dtype.
        eps: added to the fp32 mean square.
        out: ``[T, H]``, same dtype, unit last stride.

    Returns:
        `out`.

    Raises:
        ValueError: ``H > MAX_HIDDEN`` (the capability gates it first).
    """
    t, h = x.shape
    if t == 0 or h == 0:
        return out
    rows, block, num_warps = _launch_params(t, h)
    _RMS_NORM((cdiv(t, rows),),
        x, weight, out, t, h, x.stride(0), out.stride(0), eps, ROWS=rows, BLOCK=block, num_warps=num_warps,
        **pdl(),
    )
    return out


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place: ``residual <- x + residual`` (rounded to the dtype), then ``x <- rms_norm(residual)``.

    Args:
        x, residual: ``[T, H]`` float16/bfloat16/float32 views with unit last stride, any row strides.
        weight: ``[H]``, same dtype.
        eps: added to the fp32 mean square.

    Raises:
        ValueError: ``H > MAX_HIDDEN`` (the capability gates it first).
    """
    t, h = x.shape
    if t == 0 or h == 0:
        return
    rows, block, num_warps = _launch_params(t, h)
    _FUSED_ADD_RMS_NORM((cdiv(t, rows),),
        x, residual, weight, t, h, x.stride(0), residual.stride(0), eps, ROWS=rows, BLOCK=block,
        num_warps=num_warps, **pdl(),
    )


def _capability() -> Capability:
    return Capability(
        *base_constraints(),
        OneOf("dtype", ("float16", "bfloat16", "float32")),
        Between("hidden_size", 1, MAX_HIDDEN, fix="use the torch provider for wider rows"),
    )


IMPLEMENTATIONS = [
    Implementation("rms_norm", "triton", "triton.rms_norm", _capability(), PRIORITY, rms_norm),
    Implementation("fused_add_rms_norm", "triton", "triton.fused_add_rms_norm", _capability(), PRIORITY,
                   fused_add_rms_norm),
]

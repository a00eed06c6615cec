"""RmsNormGated as one Triton kernel (mamba_ssm's / vLLM's ``layernorm_gated`` forward, RMS form).

A program normalizes one group of one row: it loads the group's ``group_size`` channels of ``x`` (and ``z``)
into registers (``BLOCK = next_power_of_2(group_size)``), gates ``x`` by ``silu(z)`` first when
``norm_before_gate`` is off, takes the mean square in fp32, applies weight and bias in fp32, gates after when
it is on, and stores the result rounded once to the dtype. The grid is rows x groups.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infiniops_py import Between, Capability, Implementation, OneOf
from infiniops_triton._common import PRIORITY, base_constraints, next_power_of_2, pdl, pdl_start
from infiniops_triton._fastlaunch import Launcher

__all__ = ["IMPLEMENTATIONS", "rms_norm_gated"]

MAX_GROUP = 65536  # one group lives in registers: 64 fp32 values per thread at 32 warps


@triton.jit
def _rms_norm_gated_kernel(
    X,  # *dtype [T, H] input, rows `stride_x` apart, unit column stride
    Z,  # *dtype [T, H] gate, rows `stride_z` apart (unused without HAS_Z)
    W,  # *dtype [H] weight
    B,  # *dtype [H] bias (unused without HAS_BIAS)
    Y,  # *dtype [T, H] output, rows `stride_y` apart
    GROUP,  # channels per group
    stride_x,
    stride_z,
    stride_y,
    eps,
    BLOCK: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    NORM_BEFORE_GATE: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * GROUP + tl.arange(0, BLOCK)
    mask = tl.arange(0, BLOCK) < GROUP
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_Z:
        z = tl.load(Z + row * stride_z + cols, mask=mask, other=0.0).to(tl.float32)
        gate = z / (1.0 + tl.exp(-z))
        if not NORM_BEFORE_GATE:
            x = x * gate
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / GROUP + eps)
    y = x * rstd * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_Z and NORM_BEFORE_GATE:
        y = y * gate
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


_RMS_NORM_GATED = Launcher(_rms_norm_gated_kernel)


def rms_norm_gated(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor | None,
                   eps: float, group_size: int, norm_before_gate: bool, out: torch.Tensor) -> torch.Tensor:
    """``out = rms_norm_gated(x, weight, bias, z, eps, group_size, norm_before_gate)`` row by row, group by group.

    Args:
        x, z: ``[T, H]`` float16/bfloat16/float32, unit last stride, any row strides (z may be None).
        weight, bias: ``[H]``, same dtype (bias may be None).
        eps: added to each group's fp32 mean square. group_size: divides H.
        out: ``[T, H]``, same dtype, unit last stride.

    Returns:
        `out`.

    Raises:
        ValueError: ``group_size > MAX_GROUP`` (the capability gates it first).
    """
    t, h = x.shape
    if group_size > MAX_GROUP:
        raise ValueError(f"triton rms_norm_gated: group_size {group_size} > {MAX_GROUP}; use the torch provider")
    if t == 0 or h == 0:
        return out
    block = next_power_of_2(group_size)
    num_warps = min(32, max(1, block // 256))
    _RMS_NORM_GATED((t, h // group_size),
        x, x if z is None else z, weight, weight if bias is None else bias, out, group_size, x.stride(0),
        0 if z is None else z.stride(0), out.stride(0), eps, BLOCK=block, HAS_Z=z is not None,
        HAS_BIAS=bias is not None, NORM_BEFORE_GATE=norm_before_gate, num_warps=num_warps, **pdl(),
    )
    return out


IMPLEMENTATIONS = [
    Implementation(
        "rms_norm_gated", "triton", "triton.rms_norm_gated",
        Capability(
            *base_constraints(),
            OneOf("dtype", ("float16", "bfloat16", "float32")),
            Between("group_size", 1, MAX_GROUP, fix="use the torch provider for wider groups"),
        ),
        PRIORITY, rms_norm_gated,
    ),
]

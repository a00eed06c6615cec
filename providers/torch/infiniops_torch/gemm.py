"""Gemm through ``torch.addmm`` / ``torch.baddbmm``: alpha, beta * c and bias fused into the BLAS epilogue."""

from __future__ import annotations

import torch

from infiniops_py import Capability, Implementation
from infiniops_torch._common import DEVICES, FLOAT_DTYPES, PRIORITY

__all__ = ["IMPLEMENTATIONS", "gemm"]

_LOW = (torch.float16, torch.bfloat16)


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None,
    bias: torch.Tensor | None,
    alpha: float,
    beta: float,
    trans_a: bool,
    trans_b: bool,
    out: torch.Tensor,
) -> torch.Tensor:
    """One BLAS call with fp32 accumulation; the result is rounded to the dtype once.

    ``beta * c`` or ``bias`` rides in the addmm input (``beta=0`` makes BLAS ignore it, so a NaN-filled
    `out` never leaks). BLAS has room for one addend only: with both `c` and `bias` in fp16/bf16 the
    product runs in fp32 so that the sum still rounds once.
    """
    op_a = a.transpose(-1, -2) if trans_a else a
    op_b = b.transpose(-1, -2) if trans_b else b
    addmm = torch.baddbmm if a.dim() == 3 else torch.addmm
    if c is not None and bias is not None:
        if a.dtype in _LOW:
            addend = torch.add(bias.float(), c.float(), alpha=beta)
            return out.copy_(addmm(addend, op_a.float(), op_b.float(), alpha=alpha))
        addmm(c, op_a, op_b, beta=beta, alpha=alpha, out=out)
        return out.add_(bias)
    if c is not None:
        return addmm(c, op_a, op_b, beta=beta, alpha=alpha, out=out)
    if bias is not None:
        return addmm(bias, op_a, op_b, alpha=alpha, out=out)
    if alpha == 1.0:
        return torch.matmul(op_a, op_b, out=out)
    return addmm(out, op_a, op_b, beta=0, alpha=alpha, out=out)


IMPLEMENTATIONS = [
    Implementation("gemm", "torch", "torch.addmm", Capability(DEVICES, FLOAT_DTYPES), PRIORITY, gemm),
]

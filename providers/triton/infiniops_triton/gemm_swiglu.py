"""GemmSwiglu in Triton: the decode Gemm with SiLU-and-multiply in its epilogue, one kernel.

Up to 16 rows (a decode step; up to 64 where `infiniops_triton._gemv.TABLE` names the shape with ``swiglu``) run
`infiniops_triton._gemv`'s kernel with ``SWIGLU``: each program streams the gate rows and the up rows of its output
columns side by side and writes ``silu(gate) * up`` straight away, so the ``[T, 2d]`` projection is never written;
the roundings are those of `gemm` then `silu_and_mul` (each projection rounded to the dtype, SiLU rounded, the
product rounded). More rows run the tiled Gemm into a ``[T, 2d]`` buffer, then the SiluAndMul kernel: two
launches, the same values.
"""

from __future__ import annotations

import torch

from infiniops_py import Capability, Implementation, OneOf
from infiniops_triton import _gemv
from infiniops_triton._common import PRIORITY, base_constraints
from infiniops_triton.gemm import gemm
from infiniops_triton.silu_and_mul import silu_and_mul

__all__ = ["IMPLEMENTATIONS", "gemm_swiglu"]


def gemm_swiglu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    """``out = silu(x @ gate.T + b_gate) * (x @ up.T + b_up)``: x ``[T, K]`` (unit last stride), weight ``[2d, K]``
    gate rows then up rows (unit last stride), bias None or ``[2d]``, out ``[T, d]`` contiguous; one dtype."""
    (m, k), (stride_xm, stride_xk), (stride_wn, stride_wk) = x.shape, x.stride(), weight.stride()
    d = out.shape[1]
    if _gemv.takes(m, d, stride_xm, stride_xk, stride_wk, k=k, swiglu=True):
        return _gemv.launch(x, weight, m, d, k, stride_xm, stride_wn, None, bias, 1.0, 0.0, out, swiglu=True)
    projected = torch.empty((m, weight.shape[0]), dtype=x.dtype, device=x.device)
    gemm(x, weight, None, bias, 1.0, 0.0, False, True, projected)
    return silu_and_mul(projected, out)


IMPLEMENTATIONS = [
    Implementation(
        "gemm_swiglu", "triton", "triton.gemm_swiglu",
        Capability(*base_constraints(), OneOf("dtype", ("float16", "bfloat16", "float32"))),
        PRIORITY, gemm_swiglu,
    ),
]

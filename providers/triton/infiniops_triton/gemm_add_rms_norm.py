"""GemmAddRmsNorm in Triton: the decode Gemm with the residual add and the RMSNorm in its epilogue, one kernel.

Up to 16 rows (a decode step; up to 64 where `infiniops_triton._gemv.TABLE` names the plain product's shape) run
`infiniops_triton._gemv`'s kernel with ``ADD_NORM``: each program adds its output columns of the projection
(rounded to the dtype, with the bias) into the residual, and the last program to finish (a counter, reset by that
program, so a CUDA graph replays it) normalizes the whole rows into `out`; the roundings are those of `gemm` then
`fused_add_rms_norm`. More rows run the tiled Gemm into `out`, then the FusedAddRmsNorm kernel over `out` and the
residual: two launches, the same values.
"""

from __future__ import annotations

import torch

from infiniops_py import Between, Capability, Implementation, OneOf
from infiniops_triton import _gemv
from infiniops_triton._common import PRIORITY, base_constraints
from infiniops_triton.gemm import gemm
from infiniops_triton.rms_norm import MAX_HIDDEN, fused_add_rms_norm

__all__ = ["IMPLEMENTATIONS", "gemm_add_rms_norm"]


def gemm_add_rms_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor,
                      norm_weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """``residual += x @ weight.T + bias``; ``out = rms_norm(residual) * norm_weight``: x ``[T, K]`` (unit last
    stride), weight ``[N, K]`` (unit last stride), bias None or ``[N]``, residual ``[T, N]`` (unit last stride),
    norm_weight ``[N]``, out ``[T, N]`` contiguous; one dtype."""
    (m, k), (stride_xm, stride_xk), (stride_wn, stride_wk) = x.shape, x.stride(), weight.stride()
    n = out.shape[1]
    if _gemv.takes(m, n, stride_xm, stride_xk, stride_wk, k=k) and m * residual.stride(0) < 2**31:
        _gemv.launch(x, weight, m, n, k, stride_xm, stride_wn, None, bias, 1.0, 0.0, out, residual=residual,
                     norm_weight=norm_weight, eps=eps)
        return
    gemm(x, weight, None, bias, 1.0, 0.0, False, True, out)
    fused_add_rms_norm(out, residual, norm_weight, eps)


IMPLEMENTATIONS = [
    Implementation(
        "gemm_add_rms_norm", "triton", "triton.gemm_add_rms_norm",
        Capability(*base_constraints(), OneOf("dtype", ("float16", "bfloat16", "float32")),
                   Between("hidden_size", 1, MAX_HIDDEN, fix="use the torch provider for wider rows")),
        PRIORITY, gemm_add_rms_norm,
    ),
]

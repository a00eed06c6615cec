"""RmsNormGemm in Triton: the decode Gemm with the RMSNorm of its input rows in its prologue, one kernel.

Up to 16 rows (a decode step; up to 64 where `infiniops_triton._gemv.TABLE` names the plain product's shape) run
`infiniops_triton._gemv`'s kernel with ``PRE_NORM``: each program (each split of the K range too) first reads its
rows of x once for their mean square (the rows are small and in L2: every program reads them anyway), then
normalizes each x tile as it loads it, ``(x * rstd).to(dtype) * norm_weight`` rounded as `rms_norm` rounds it, so
nothing waits on another program (no serial tail) and the normed rows are never written. With ``swiglu`` the
kernel's ``SWIGLU`` epilogue follows (`gemm_swiglu`). More rows run the RmsNorm kernel into a ``[T, K]`` buffer,
then the tiled Gemm (or `gemm_swiglu`): two launches, the same values.
"""

from __future__ import annotations

import torch

from infiniops_py import Capability, Implementation, OneOf
from infiniops_triton import _gemv
from infiniops_triton._common import PRIORITY, base_constraints
from infiniops_triton.gemm import gemm
from infiniops_triton.gemm_swiglu import gemm_swiglu
from infiniops_triton.rms_norm import MAX_HIDDEN, rms_norm

__all__ = ["IMPLEMENTATIONS", "rms_norm_gemm"]


def rms_norm_gemm(x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  eps: float, swiglu: bool, out: torch.Tensor) -> None:
    """``out = rms_norm(x) * norm_weight @ weight.T + bias`` (with `swiglu`, ``silu(gate) * up`` of it): x ``[T, K]``
    (unit last stride), norm_weight ``[K]``, weight ``[N, K]`` (``[2d, K]``, unit last stride), bias None or its
    rows, out ``[T, N]`` (``[T, d]``) contiguous; one dtype."""
    (m, k), (stride_xm, stride_xk), (stride_wn, stride_wk) = x.shape, x.stride(), weight.stride()
    n = out.shape[1]
    if _gemv.takes(m, n, stride_xm, stride_xk, stride_wk, k=k, swiglu=swiglu):
        _gemv.launch(x, weight, m, n, k, stride_xm, stride_wn, None, bias, 1.0, 0.0, out, swiglu=swiglu, eps=eps,
                     pre_norm=norm_weight)
        return
    normed = torch.empty((m, k), dtype=x.dtype, device=x.device)
    if k <= MAX_HIDDEN:
        rms_norm(x, norm_weight, eps, normed)
    else:  # wider than the RmsNorm kernel's rows: torch's, with the same roundings
        torch.mul(torch.nn.functional.rms_norm(x, (k,), eps=eps), norm_weight, out=normed)
    if swiglu:
        gemm_swiglu(normed, weight, bias, out)
    else:
        gemm(normed, weight, None, bias, 1.0, 0.0, False, True, out)


IMPLEMENTATIONS = [
    Implementation(
        "rms_norm_gemm", "triton", "triton.rms_norm_gemm",
        Capability(*base_constraints(), OneOf("dtype", ("float16", "bfloat16", "float32"))),
        PRIORITY, rms_norm_gemm,
    ),
]

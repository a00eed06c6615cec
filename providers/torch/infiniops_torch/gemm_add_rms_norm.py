"""GemmAddRmsNorm as ``F.linear``, the in-place residual add, then ``F.rms_norm`` times the norm weight: the
projection rounded, the sum rounded, the normalized value rounded, then the weight (`infiniops_torch.rms_norm`'s
order)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infiniops_py import Capability, Implementation
from infiniops_torch._common import DEVICES, FLOAT_DTYPES, PRIORITY

__all__ = ["IMPLEMENTATIONS", "gemm_add_rms_norm"]


def gemm_add_rms_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor,
                      norm_weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """``residual += x @ weight.T + bias``; ``out = rms_norm(residual) * norm_weight``: x ``[T, K]``, weight
    ``[N, K]``, residual and out ``[T, N]``."""
    residual.add_(F.linear(x, weight, bias))
    torch.mul(F.rms_norm(residual, (residual.shape[-1],), eps=eps), norm_weight, out=out)


IMPLEMENTATIONS = [
    Implementation("gemm_add_rms_norm", "torch", "torch.gemm_add_rms_norm", Capability(DEVICES, FLOAT_DTYPES),
                   PRIORITY, gemm_add_rms_norm),
]

"""GemmSwiglu as ``F.linear`` then ``F.silu(gate) * up``: the projection rounded, SiLU rounded, the product."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infiniops_py import Capability, Implementation
from infiniops_torch._common import DEVICES, FLOAT_DTYPES, PRIORITY

__all__ = ["IMPLEMENTATIONS", "gemm_swiglu"]


def gemm_swiglu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    """``out = silu(g) * u`` for ``[g | u] = x @ weight.T + bias``: x ``[T, K]``, weight ``[2d, K]``, out ``[T, d]``."""
    projected = F.linear(x, weight, bias)
    d = out.shape[1]
    return torch.mul(F.silu(projected[:, :d]), projected[:, d:], out=out)


IMPLEMENTATIONS = [
    Implementation("gemm_swiglu", "torch", "torch.gemm_swiglu", Capability(DEVICES, FLOAT_DTYPES), PRIORITY,
                   gemm_swiglu),
]

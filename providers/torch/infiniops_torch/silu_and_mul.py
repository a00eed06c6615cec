"""SiluAndMul as ``F.silu(gate) * up``: SiLU in fp32 rounded to the dtype, then the product (vLLM's native form)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infiniops_py import Capability, Implementation
from infiniops_torch._common import DEVICES, FLOAT_DTYPES, PRIORITY

__all__ = ["IMPLEMENTATIONS", "silu_and_mul"]


def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out = F.silu(x[:, :d]) * x[:, d:]`` for x ``[T, 2d]`` (strided rows), out ``[T, d]`` contiguous."""
    d = out.shape[1]
    return torch.mul(F.silu(x[:, :d]), x[:, d:], out=out)


IMPLEMENTATIONS = [
    Implementation("silu_and_mul", "torch", "torch.silu_and_mul", Capability(DEVICES, FLOAT_DTYPES), PRIORITY,
                   silu_and_mul),
]

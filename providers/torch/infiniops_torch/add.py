"""Add through ``torch.add(out=...)``: broadcasting and in place come for free."""

from __future__ import annotations

import torch

from infiniops_py import Capability, Implementation
from infiniops_torch._common import DEVICES, FLOAT_DTYPES, PRIORITY

__all__ = ["IMPLEMENTATIONS", "add"]


def add(input: torch.Tensor, other: torch.Tensor, alpha: float, out: torch.Tensor) -> torch.Tensor:
    if alpha == 1.0:
        return torch.add(input, other, out=out)
    return torch.add(input, other, alpha=alpha, out=out)


IMPLEMENTATIONS = [
    Implementation("add", "torch", "torch.add", Capability(DEVICES, FLOAT_DTYPES), PRIORITY, add),
]

"""RmsNormGated in plain PyTorch: fp32 math over ``[T, G, group]`` views, one rounding (mamba's ``rms_norm_ref``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infiniops_py import Capability, Implementation
from infiniops_torch._common import DEVICES, FLOAT_DTYPES, PRIORITY

__all__ = ["IMPLEMENTATIONS", "rms_norm_gated"]


def rms_norm_gated(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor | None,
                   eps: float, group_size: int, norm_before_gate: bool, out: torch.Tensor) -> torch.Tensor:
    """``out = rms_norm_gated(x, ...)`` for x, z ``[T, H]`` (strided rows), out ``[T, H]`` contiguous."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    g = x.to(acc)
    if z is not None and not norm_before_gate:
        g = g * F.silu(z.to(acc))
    grouped = g.unflatten(-1, (-1, group_size))
    y = grouped * torch.rsqrt(grouped.square().mean(-1, keepdim=True) + eps)
    y = y.flatten(-2) * weight
    if bias is not None:
        y = y + bias
    if z is not None and norm_before_gate:
        y = y * F.silu(z.to(acc))
    return out.copy_(y)


IMPLEMENTATIONS = [
    Implementation("rms_norm_gated", "torch", "torch.rms_norm_gated", Capability(DEVICES, FLOAT_DTYPES), PRIORITY,
                   rms_norm_gated),
]

"""RmsNormGemm as ``F.rms_norm`` times the norm weight, then ``F.linear`` (then SiLU-and-multiply with `swiglu`): the
normalized value rounded, then the weight, then the projection (`infiniops_torch.rms_norm` then `gemm`'s order)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infiniops_py import Capability, Implementation
from infiniops_torch._common import DEVICES, FLOAT_DTYPES, PRIORITY

__all__ = ["IMPLEMENTATIONS", "rms_norm_gemm"]


def rms_norm_gemm(x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  eps: float, swiglu: bool, out: torch.Tensor) -> None:
    """``out = rms_norm(x) * norm_weight @ weight.T + bias`` (with `swiglu`, ``silu(gate) * up`` of it): x ``[T, K]``,
    norm_weight ``[K]``, weight ``[N, K]`` (``[2d, K]``), out ``[T, N]`` (``[T, d]``)."""
    normed = F.rms_norm(x, (x.shape[-1],), eps=eps) * norm_weight
    if not swiglu:
        out.copy_(F.linear(normed, weight, bias))
        return
    projected = F.linear(normed, weight, bias)
    d = out.shape[1]
    torch.mul(F.silu(projected[:, :d]), projected[:, d:], out=out)


IMPLEMENTATIONS = [
    Implementation("rms_norm_gemm", "torch", "torch.rms_norm_gemm", Capability(DEVICES, FLOAT_DTYPES), PRIORITY,
                   rms_norm_gemm),
]

"""RmsNorm and fused add + RmsNorm through ``F.rms_norm`` (fp32 mean square, output in the input dtype).

``F.rms_norm`` is called without its weight: it returns the normalized value already cast to the dtype,
which is what the contract multiplies by the weight (HF's ``LlamaRMSNorm``); passing the weight to it
would round once instead of twice and drift from the checkpoints' semantics.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infiniops_py import Capability, Implementation
from infiniops_torch._common import DEVICES, FLOAT_DTYPES, PRIORITY

__all__ = ["IMPLEMENTATIONS", "fused_add_rms_norm", "rms_norm"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> torch.Tensor:
    return torch.mul(F.rms_norm(x, (x.shape[-1],), eps=eps), weight, out=out)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    residual.add_(x)
    torch.mul(F.rms_norm(residual, (x.shape[-1],), eps=eps), weight, out=x)


IMPLEMENTATIONS = [
    Implementation("rms_norm", "torch", "torch.rms_norm", Capability(DEVICES, FLOAT_DTYPES), PRIORITY, rms_norm),
    Implementation("fused_add_rms_norm", "torch", "torch.fused_add_rms_norm", Capability(DEVICES, FLOAT_DTYPES),
                   PRIORITY, fused_add_rms_norm),
]

"""FusedQkNorm through one ``F.rms_norm`` over the Q and K heads of the packed QKV, viewed ``[T, Hq + Hkv, D]``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infiniops_py import Capability, Implementation
from infiniops_torch._common import DEVICES, FLOAT_DTYPES, PRIORITY

__all__ = ["IMPLEMENTATIONS", "fused_qk_norm"]


def fused_qk_norm(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float,
) -> None:
    """Q and K heads are adjacent columns of each row: normalize them in one call, then scale per head."""
    heads = num_q_heads + num_kv_heads
    qk = qkv[:, : heads * head_dim].view(qkv.shape[0], heads, head_dim)  # V columns are not in the view
    weight = torch.cat((q_weight.expand(num_q_heads, head_dim), k_weight.expand(num_kv_heads, head_dim)))
    torch.mul(F.rms_norm(qk, (head_dim,), eps=eps), weight, out=qk)


IMPLEMENTATIONS = [
    Implementation("fused_qk_norm", "torch", "torch.fused_qk_norm", Capability(DEVICES, FLOAT_DTYPES), PRIORITY,
                   fused_qk_norm),
]

"""FusedQkNormRope through plain PyTorch ops: one fp32 ``F.rms_norm`` over the Q and K heads of the packed QKV,
times the weights, then this provider's RoPE on that fp32 copy, written back with one rounding to the dtype.

The normalized heads stay in fp32 through the rotation, as in vLLM's fused kernel (the contract's numbers),
so the result is not bit for bit this provider's `fused_qk_norm` followed by its `rotary_embedding`, which
round the normalized value and its product with the weight to the dtype in between.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infiniops_py import Capability, Implementation
from infiniops_torch._common import DEVICES, FLOAT_DTYPES, PRIORITY
from infiniops_torch.rotary_embedding import rotary_embedding

__all__ = ["IMPLEMENTATIONS", "fused_qk_norm_rope"]


def fused_qk_norm_rope(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float,
    is_neox: bool,
) -> None:
    """Per-head RmsNorm of the Q and K heads of `qkv` ``[T, (Hq + 2*Hkv) * D]``, then RoPE on them; V untouched."""
    heads = num_q_heads + num_kv_heads
    qk = qkv[:, : heads * head_dim].view(qkv.shape[0], heads, head_dim)  # V columns are not in the view
    weight = torch.cat((q_weight.expand(num_q_heads, head_dim), k_weight.expand(num_kv_heads, head_dim))).float()
    normed = F.rms_norm(qk.float(), (head_dim,), eps=eps) * weight  # a new fp32 tensor
    rotary_embedding(positions, normed, None, cos_sin_cache, is_neox)  # Q and K heads alike, in fp32
    qk.copy_(normed)


IMPLEMENTATIONS = [
    Implementation("fused_qk_norm_rope", "torch", "torch.fused_qk_norm_rope", Capability(DEVICES, FLOAT_DTYPES),
                   PRIORITY, fused_qk_norm_rope),
]

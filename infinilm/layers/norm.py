"""RMSNorm layers through `infiniops_py.rms_norm` / `fused_add_rms_norm` / `gemm_add_rms_norm` / `fused_qk_norm`.

Numerics (HF ``LlamaRMSNorm``, ``Qwen3RMSNorm``): variance in fp32, the normalized value cast to the
input dtype, then multiplied by the weight. Qwen3's q/k norms are per-head RMSNorms over ``head_dim``
applied before RoPE; `QKNorm` runs them either fused over the packed QKV (in place, V untouched) or as two
separate `rms_norm` calls over the head views, whichever the gate plan picked: both give the same values.
"""

from __future__ import annotations

import torch

from infinilm.layers.linear import Linear, RowParallelLinear
from infiniops_py import fused_add_rms_norm, fused_qk_norm, gemm_add_rms_norm, rms_norm

__all__ = ["QKNorm", "RMSNorm"]


class RMSNorm:
    """RMSNorm over the last dim of ``[T, H]`` with weight ``[H]``."""

    __slots__ = ("eps", "weight")

    def __init__(self, hidden_size: int, eps: float, *, dtype: torch.dtype, device: torch.device) -> None:
        self.weight = torch.empty(hidden_size, dtype=dtype, device=device)
        self.eps = eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """In place: ``residual <- x + residual``, ``x <- rms_norm(residual)``; returns ``(x, residual)``."""
        return fused_add_rms_norm(x, residual, self.weight, self.eps)

    def project_add_norm(self, linear: Linear | RowParallelLinear, x: torch.Tensor,
                         residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`add_norm` of ``linear(x)`` in one `gemm_add_rms_norm`: ``residual <- linear(x) + residual`` in place;
        returns ``(rms_norm(residual), residual)``, the projection never written out. `linear` holds the whole
        weight (one process: a row-parallel one would need its all-reduce before the add)."""
        return gemm_add_rms_norm(x, linear.weight, residual, self.weight, self.eps, bias=linear.bias)


class QKNorm:
    """Per-head RMSNorm of the Q and K heads of a packed ``qkv`` ``[T, (Hq + 2 Hkv) * D]``."""

    __slots__ = ("eps", "fused", "head_dim", "k_weight", "num_heads", "num_kv_heads", "q_weight")

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, eps: float, *, fused: bool,
        dtype: torch.dtype, device: torch.device,
    ) -> None:
        self.q_weight = torch.empty(head_dim, dtype=dtype, device=device)
        self.k_weight = torch.empty(head_dim, dtype=dtype, device=device)
        self.num_heads, self.num_kv_heads, self.head_dim, self.eps, self.fused = (
            num_heads, num_kv_heads, head_dim, eps, fused)

    def __call__(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normalized q ``[T, Hq, D]``, k ``[T, Hkv, D]`` and the untouched v ``[T, Hkv, D]``."""
        t, d, hq, hkv = qkv.shape[0], self.head_dim, self.num_heads, self.num_kv_heads
        if self.fused:
            fused_qk_norm(qkv, self.q_weight, self.k_weight, num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                          eps=self.eps)
            q, k, v = qkv.split((hq * d, hkv * d, hkv * d), dim=-1)
            return q.view(t, hq, d), k.view(t, hkv, d), v.view(t, hkv, d)
        q, k, v = qkv.split((hq * d, hkv * d, hkv * d), dim=-1)
        q = rms_norm(q.view(t, hq, d), self.q_weight, self.eps)
        k = rms_norm(k.view(t, hkv, d), self.k_weight, self.eps)
        return q, k, v.view(t, hkv, d)

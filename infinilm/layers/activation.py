"""SiLU-and-multiply of the packed gate/up projection (plain PyTorch, as HF's ``act_fn(gate) * up``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["silu_and_mul"]


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[:, :I]) * x[:, I:]`` for x ``[T, 2I]``; returns ``[T, I]`` in x's dtype."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up

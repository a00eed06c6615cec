"""What both FlashAttention entry points hand an implementation: the problem fields they share, the keyword
arguments of a call (only those set), and the log-sum-exp's dtype."""

from __future__ import annotations

import torch

__all__ = ["FIELDS", "lse_dtype", "set_kwargs"]

FIELDS = {"head_dim": 128, "gqa_ratio": 1, "causal": False, "local": False, "softcap": False, "paged": False,
          "block_size": 0, "alibi": False, "return_softmax_lse": False, "fp8_kv": False}


def set_kwargs(**extras: object) -> dict[str, object]:
    """The keyword arguments of an implementation call that are set: an implementation that does not declare
    a feature's problem field never receives its argument."""
    return {name: value for name, value in extras.items() if value is not None}


def lse_dtype(q: torch.Tensor) -> torch.dtype:
    """The log-sum-exp's dtype: float64 for float64 q, else float32."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32

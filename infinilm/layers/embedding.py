"""Token embedding (plain PyTorch lookup) and the LM head (a Gemm through `infiniops_py`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infiniops_py import gemm

__all__ = ["Embedding", "LMHead"]


class Embedding:
    """Lookup in weight ``[V, H]``: int64 ids ``[T]`` -> ``[T, H]``."""

    __slots__ = ("weight",)

    def __init__(self, vocab_size: int, hidden_size: int, *, dtype: torch.dtype, device: torch.device) -> None:
        self.weight = torch.empty(vocab_size, hidden_size, dtype=dtype, device=device)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class LMHead:
    """Logits ``[B, V]`` = hidden ``[B, H]`` @ weight ``[V, H]``.T; weight may be the embedding's (tied)."""

    __slots__ = ("weight",)

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return gemm(hidden, self.weight, trans_b=True)

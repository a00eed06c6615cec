"""RoPE in place through plain PyTorch ops: the cache rows gathered by position, each pair rotated in fp32.

Positions outside the cache are clamped for the gather (so no row out of range is read) and their tokens
keep their values (``torch.where``): no host synchronization, so the implementation runs under CUDA-graph
capture. The first ``rotary_dim`` channels are written back through strided views of the heads (the two
halves for NeoX, the even and odd channels for GPT-J); the other channels are never written.
"""

from __future__ import annotations

import torch

from infiniops_py import Capability, Implementation
from infiniops_torch._common import DEVICES, FLOAT_DTYPES, PRIORITY

__all__ = ["IMPLEMENTATIONS", "rotary_embedding"]


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> None:
    """Rotate query ``[T, Hq, D]`` and key ``[T, Hkv, D]`` (or None) in place at int64 `positions` ``[T]``.

    Each pair ``(x, y)`` becomes ``(x cos - y sin, y cos + x sin)`` in fp32, rounded once to the dtype.
    """
    max_position, rotary_dim = cos_sin_cache.shape
    half = rotary_dim // 2
    valid = (positions >= 0) & (positions < max_position)
    rows = cos_sin_cache.index_select(0, torch.where(valid, positions, 0)).float()
    cos, sin = rows[:, None, :half], rows[:, None, half:]
    keep = valid[:, None, None]
    for x in (query, key):
        if x is None:
            continue
        turned = x[..., :rotary_dim]
        first, second = (turned[..., :half], turned[..., half:]) if is_neox else (turned[..., 0::2], turned[..., 1::2])
        a, b = first.float(), second.float()  # views of x itself when x is float32: both results come first
        new_first, new_second = (a * cos - b * sin).to(x.dtype), (b * cos + a * sin).to(x.dtype)
        first.copy_(torch.where(keep, new_first, first))
        second.copy_(torch.where(keep, new_second, second))


IMPLEMENTATIONS = [
    Implementation("rotary_embedding", "torch", "torch.rotary_embedding", Capability(DEVICES, FLOAT_DTYPES),
                   PRIORITY, rotary_embedding),
]

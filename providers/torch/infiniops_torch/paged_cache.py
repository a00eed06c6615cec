"""Paged-cache write through one vectorized ``index_put_`` per cache, padding and out-of-range slots filtered."""

from __future__ import annotations

import torch

from infiniops_py import Capability, Implementation
from infiniops_torch._common import DEVICES, FLOAT_DTYPES, PRIORITY

__all__ = ["IMPLEMENTATIONS", "reshape_and_cache_flash"]


def reshape_and_cache_flash(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Keeps the tokens with ``0 <= slot < capacity`` (one host sync), then scatters them by (block, offset).

    Indexing by (block, offset) rather than a flat slot works for any cache strides (NHD or HND views).
    """
    num_blocks, block_size = key_cache.shape[:2]
    keep = ((slot_mapping >= 0) & (slot_mapping < num_blocks * block_size)).nonzero().squeeze(1)
    slots = slot_mapping.index_select(0, keep)
    where = (torch.div(slots, block_size, rounding_mode="floor"), slots % block_size)
    key_cache.index_put_(where, key.index_select(0, keep))
    value_cache.index_put_(where, value.index_select(0, keep))


IMPLEMENTATIONS = [
    Implementation("reshape_and_cache_flash", "torch", "torch.index_put", Capability(DEVICES, FLOAT_DTYPES),
                   PRIORITY, reshape_and_cache_flash),
]

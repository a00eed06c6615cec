"""Paged-cache write through one vectorized ``index_put_`` per cache (`put_rows`): padding and out-of-range
slots are skipped without a host synchronization; an fp8 cache receives the contract's quantization."""

from __future__ import annotations

import torch

from infiniops_py import Capability, Implementation
from infiniops_torch._common import DEVICES, FLOAT_DTYPES, PRIORITY, put_rows

__all__ = ["IMPLEMENTATIONS", "reshape_and_cache_flash"]

_FP8_MAX = 448.0


def _quantized(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``float8_e4m3fn(clamp(float32(x) / scale, -448, 448))`` (vLLM's ``scaled_convert``), on the device."""
    return (x.float() / scale.reshape(()).float()).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)


def reshape_and_cache_flash(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Scatters the tokens with ``0 <= slot < capacity`` by (block, offset), skipping the rest on the device
    (no host sync); of tokens sharing a slot (rejected in checked mode), which lands is undefined. With
    `k_scale`/`v_scale` (an fp8 cache) the rows are quantized first.

    Indexing by (block, offset) rather than a flat slot works for any cache strides (NHD or HND views).
    """
    num_blocks, block_size = key_cache.shape[:2]
    n = slot_mapping.shape[0]
    valid = (slot_mapping >= 0) & (slot_mapping < num_blocks * block_size)
    where = (torch.div(slot_mapping, block_size, rounding_mode="floor"), slot_mapping % block_size)
    keys, values = key[:n], value[:n]
    if k_scale is not None and v_scale is not None:
        keys, values = _quantized(keys, k_scale), _quantized(values, v_scale)
    put_rows(key_cache, where, keys, valid)
    put_rows(value_cache, where, values, valid)


IMPLEMENTATIONS = [
    Implementation("reshape_and_cache_flash", "torch", "torch.index_put", Capability(DEVICES, FLOAT_DTYPES),
                   PRIORITY, reshape_and_cache_flash),
]

"""Paged-cache write (vLLM's reshape_and_cache_flash): one CUDA block per token; bad slots are skipped."""

from __future__ import annotations

import numpy as np
import torch

from infiniops_cupy._common import DTYPES, PRIORITY, SCALAR_TYPES, as_cupy, base_constraints, module, stream
from infiniops_py import Capability, Implementation, OneOf

__all__ = ["IMPLEMENTATIONS", "reshape_and_cache_flash"]

_SOURCE = r"""
extern "C" __global__ void reshape_and_cache_flash(
        const SCALAR* __restrict__ key, const SCALAR* __restrict__ value,
        SCALAR* __restrict__ k_cache, SCALAR* __restrict__ v_cache, const long long* __restrict__ slots,
        long long k_tok, long long k_head, long long v_tok, long long v_head,       // key/value strides
        long long c_block, long long c_slot, long long c_head,                        // cache strides (d: 1)
        long long vc_block, long long vc_slot, long long vc_head,
        long long num_heads, long long head_dim, long long block_size, long long num_slots) {
    const long long t = blockIdx.x;
    const long long s = slots[t];
    if (s < 0 || s >= num_slots) return;              // padding, or out of range: never write out of bounds
    const long long blk = s / block_size, off = s % block_size;
    for (long long i = threadIdx.x; i < num_heads * head_dim; i += blockDim.x) {
        const long long h = i / head_dim, d = i % head_dim;
        k_cache[blk * c_block + off * c_slot + h * c_head + d] = key[t * k_tok + h * k_head + d];
        v_cache[blk * vc_block + off * vc_slot + h * vc_head + d] = value[t * v_tok + h * v_head + d];
    }
}
"""


def reshape_and_cache_flash(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    n = slot_mapping.shape[0]
    if n == 0:
        return
    num_blocks, block_size, heads, head_dim = key_cache.shape
    fn = module(_SOURCE, SCALAR_TYPES[key.dtype]).get_function("reshape_and_cache_flash")
    i64 = np.int64
    with stream(key.device):
        fn((n,), (min(512, max(32, heads * head_dim)),), (
            as_cupy(key), as_cupy(value), as_cupy(key_cache), as_cupy(value_cache), as_cupy(slot_mapping),
            i64(key.stride(0)), i64(key.stride(1)), i64(value.stride(0)), i64(value.stride(1)),
            i64(key_cache.stride(0)), i64(key_cache.stride(1)), i64(key_cache.stride(2)),
            i64(value_cache.stride(0)), i64(value_cache.stride(1)), i64(value_cache.stride(2)),
            i64(heads), i64(head_dim), i64(block_size), i64(num_blocks * block_size)))


IMPLEMENTATIONS = [
    Implementation("reshape_and_cache_flash", "cupy", "cupy.reshape_and_cache_flash",
                   Capability(*base_constraints(), DTYPES,
                              OneOf("fp8_kv", (False,), fix="the kernel writes no float8_e4m3fn cache yet: use the "
                                    "torch provider")),
                   PRIORITY, reshape_and_cache_flash),
]

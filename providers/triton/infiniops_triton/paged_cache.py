"""Paged-cache write as one Triton kernel (vLLM ``reshape_and_cache_flash`` semantics).

A program copies ``BLOCK_H`` heads of one token's key and value rows into the slot
``slot_mapping[t]`` of the caches (block ``slot // block_size``, offset ``slot % block_size``). A padding
slot (``< 0``) and an out-of-range slot (possible only in unchecked mode) mask every load and store of the
program: nothing is read or written. Plain copies, so the caches match the inputs bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infiniops_py import Between, Capability, Implementation, OneOf
from infiniops_triton._common import PRIORITY, base_constraints, cdiv, next_power_of_2
from infiniops_triton._fastlaunch import Launcher

__all__ = ["IMPLEMENTATIONS", "reshape_and_cache_flash"]

MAX_HEAD_DIM = 1024
_ELEMS_PER_PROGRAM = 2048  # heads per program grow until a program copies this many elements per tensor


@triton.jit
def _reshape_and_cache_kernel(
    K,  # *dtype [T, Hkv, D] new keys (strided rows and heads, unit last stride)
    V,  # *dtype [T, Hkv, D] new values
    KC,  # *dtype [num_blocks, block_size, Hkv, D] key cache, written at the slots
    VC,  # *dtype [num_blocks, block_size, Hkv, D] value cache
    SLOTS,  # *int64 [N] slot per token (`stride_s` apart), < 0 for padding
    stride_s,
    num_slots,  # num_blocks * block_size: slots at or past it are skipped
    block_size,
    num_heads,
    D,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kcs, stride_kch, stride_kcd,
    stride_vcb, stride_vcs, stride_vch, stride_vcd,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(SLOTS + token * stride_s).to(tl.int64)
    valid = (slot >= 0) & (slot < num_slots)
    slot = tl.where(valid, slot, 0)
    block = slot // block_size
    offset = slot % block_size
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_D)
    mask = valid & (heads[:, None] < num_heads) & (cols[None, :] < D)
    k = tl.load(K + token * stride_kt + heads[:, None] * stride_kh + cols[None, :] * stride_kd, mask=mask)
    v = tl.load(V + token * stride_vt + heads[:, None] * stride_vh + cols[None, :] * stride_vd, mask=mask)
    kc = KC + block * stride_kcb + offset * stride_kcs + heads[:, None] * stride_kch + cols[None, :] * stride_kcd
    vc = VC + block * stride_vcb + offset * stride_vcs + heads[:, None] * stride_vch + cols[None, :] * stride_vcd
    tl.store(kc, k, mask=mask)
    tl.store(vc, v, mask=mask)


_RESHAPE_AND_CACHE = Launcher(_reshape_and_cache_kernel)


def reshape_and_cache_flash(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``key[t]``/``value[t]`` into the caches at ``slot_mapping[t]`` for ``t < len(slot_mapping)``.

    Args:
        key, value: ``[T, Hkv, D]`` float16/bfloat16/float32 (strided views of a packed qkv allowed).
        key_cache, value_cache: ``[num_blocks, block_size, Hkv, D]``, same dtype, any strides.
        slot_mapping: int64 ``[N]``, ``N <= T``; ``< 0`` (and, unchecked, ``>= num_blocks*block_size``)
            skips the token.

    Raises:
        ValueError: ``D > MAX_HEAD_DIM`` (the capability gates it first).
    """
    num_blocks, block_size, num_heads, head_dim = key_cache.shape
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"triton reshape_and_cache_flash: head_dim {head_dim} > {MAX_HEAD_DIM}")
    tokens = slot_mapping.shape[0]
    if tokens == 0 or num_heads == 0 or head_dim == 0:
        return
    block_d = next_power_of_2(head_dim)
    block_h = min(next_power_of_2(num_heads), max(1, _ELEMS_PER_PROGRAM // block_d))
    num_warps = min(8, max(1, block_h * block_d // 256))
    grid = (tokens, cdiv(num_heads, block_h))
    _RESHAPE_AND_CACHE(grid,
        key, value, key_cache, value_cache, slot_mapping, slot_mapping.stride(0), num_blocks * block_size,
        block_size, num_heads, head_dim, *key.stride(), *value.stride(), *key_cache.stride(), *value_cache.stride(),
        BLOCK_H=block_h, BLOCK_D=block_d, num_warps=num_warps,
    )


IMPLEMENTATIONS = [
    Implementation(
        "reshape_and_cache_flash", "triton", "triton.reshape_and_cache_flash",
        Capability(
            *base_constraints(),
            OneOf("dtype", ("float16", "bfloat16", "float32")),
            Between("head_dim", 1, MAX_HEAD_DIM, fix="use the torch provider for wider heads"),
            Between("block_size", 1, None),
            OneOf("fp8_kv", (False,), fix="the kernel writes no float8_e4m3fn cache yet: use the torch provider"),
        ),
        PRIORITY, reshape_and_cache_flash,
    ),
]

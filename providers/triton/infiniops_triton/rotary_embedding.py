"""RoPE as one Triton kernel, in place on the query and key heads (vLLM ``rotary_embedding`` semantics).

A program turns ``BLOCK_H`` heads of one token, counting the query heads first and the key heads after
them (one launch for both; each head's address comes from its own tensor's strides). It loads the token's
position, then, when the position lies in ``[0, max_position)``, the ``R/2 = rotary_dim / 2`` cosines and
sines of that cache row and the pairs ``(x, y)`` of each head (channels ``(i, i + R/2)`` for NeoX,
``(2i, 2i + 1)`` for GPT-J), and stores ``(x cos - y sin, y cos + x sin)`` computed in fp32 and rounded once.
An out-of-range position (unchecked mode) masks every load and store of the program but the position's own:
the token is left as it is and no cache row is read. Channels past ``rotary_dim`` are never touched.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from infiniops_py import Between, Capability, Implementation, OneOf
from infiniops_triton._common import PRIORITY, base_constraints, cdiv, next_power_of_2
from infiniops_triton._fastlaunch import Launcher

__all__ = ["IMPLEMENTATIONS", "rotary_embedding"]

MAX_HEAD_DIM = 1024
_PAIRS_PER_PROGRAM = 1024  # heads per program grow until a program turns this many pairs


@triton.jit
def _rotary_kernel(
    POS,  # *int64 [T] positions, `stride_p` apart
    Q,  # *dtype [T, Hq, D] query, tokens `stride_qt` apart, heads `stride_qh`, unit channel stride; in place
    K,  # *dtype [T, Hkv, D] key (Q itself when there is no key: then num_kv_heads is 0), in place
    CACHE,  # *cache_dtype [max_position, rotary_dim] contiguous: cos values, then sin values, per row
    stride_p,
    stride_qt, stride_qh,
    stride_kt, stride_kh,
    num_q_heads,
    num_heads,  # Hq + Hkv: heads h < Hq are query heads, the others key heads h - Hq
    max_position,
    HALF,  # rotary_dim / 2: the pairs per head
    IS_NEOX: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_R: tl.constexpr,  # next_power_of_2(HALF)
):
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(POS + token * stride_p)
    valid = (position >= 0) & (position < max_position)
    position = tl.where(valid, position, 0)
    pairs = tl.arange(0, BLOCK_R)
    pair_mask = valid & (pairs < HALF)
    cos = tl.load(CACHE + position * (2 * HALF) + pairs, mask=pair_mask, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(CACHE + position * (2 * HALF) + HALF + pairs, mask=pair_mask, other=0.0).to(tl.float32)[None, :]
    heads = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
    rows = tl.where(heads < num_q_heads, Q + token * stride_qt + heads * stride_qh,
                    K + token * stride_kt + (heads - num_q_heads) * stride_kh)[:, None]
    head_mask = (heads < num_heads)[:, None]
    if IS_NEOX:  # the pair halves are two contiguous runs of channels
        mask = head_mask & pair_mask[None, :]
        x = tl.load(rows + pairs[None, :], mask=mask, other=0.0).to(tl.float32)
        y = tl.load(rows + HALF + pairs[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(rows + pairs[None, :], (x * cos - y * sin).to(Q.dtype.element_ty), mask=mask)
        tl.store(rows + HALF + pairs[None, :], (y * cos + x * sin).to(Q.dtype.element_ty), mask=mask)
    else:  # interleaved pairs: one contiguous run of 2 * HALF channels, split into its even and odd ones
        channels = tl.arange(0, 2 * BLOCK_R)
        mask = head_mask & (valid & (channels < 2 * HALF))[None, :]
        xy = tl.load(rows + channels[None, :], mask=mask, other=0.0).to(tl.float32)
        x, y = tl.split(tl.reshape(xy, (BLOCK_H, BLOCK_R, 2)))
        turned = tl.reshape(tl.join(x * cos - y * sin, y * cos + x * sin), (BLOCK_H, 2 * BLOCK_R))
        tl.store(rows + channels[None, :], turned.to(Q.dtype.element_ty), mask=mask)


_ROTARY = Launcher(_rotary_kernel)


@functools.lru_cache(maxsize=1024)  # a pure function of a model's few head shapes (issue #25: host cost)
def launch_params(heads: int, half: int) -> tuple[int, int, int]:
    """(BLOCK_H, BLOCK_R, num_warps) for turning `heads` heads of `half` pairs each."""
    block_r = next_power_of_2(half)
    block_h = min(next_power_of_2(heads), max(1, _PAIRS_PER_PROGRAM // block_r))
    return block_h, block_r, min(8, max(1, block_h * block_r // 256))


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> None:
    """Rotate the first ``rotary_dim`` channels of every query and key head in place at `positions`.

    Args:
        positions: int64 ``[T]``; a value outside ``[0, max_position)`` leaves its token untouched.
        query: ``[T, Hq, D]`` float16/bfloat16/float32, unit last stride, any token and head strides.
        key: ``[T, Hkv, D]`` of query's dtype, or None.
        cos_sin_cache: ``[max_position, rotary_dim]`` contiguous, query's dtype or float32.
        is_neox: rotate-halves pairs (True) or interleaved pairs (False).

    Raises:
        ValueError: ``D > MAX_HEAD_DIM`` (the capability gates it first).
    """
    tokens, num_q_heads, head_dim = query.shape
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"triton rotary_embedding: head_dim {head_dim} > {MAX_HEAD_DIM}; use the torch provider")
    if tokens == 0:
        return
    max_position, rotary_dim = cos_sin_cache.shape
    num_heads = num_q_heads + (0 if key is None else key.shape[1])
    block_h, block_r, num_warps = launch_params(num_heads, rotary_dim // 2)
    k = query if key is None else key
    _ROTARY((tokens, cdiv(num_heads, block_h)),
        positions, query, k, cos_sin_cache, positions.stride(0), query.stride(0), query.stride(1), k.stride(0),
        k.stride(1), num_q_heads, num_heads, max_position, rotary_dim // 2,
        IS_NEOX=is_neox, BLOCK_H=block_h, BLOCK_R=block_r, num_warps=num_warps,
    )


IMPLEMENTATIONS = [
    Implementation(
        "rotary_embedding", "triton", "triton.rotary_embedding",
        Capability(
            *base_constraints(),
            OneOf("dtype", ("float16", "bfloat16", "float32")),
            Between("head_dim", 1, MAX_HEAD_DIM, fix="use the torch provider for wider heads"),
        ),
        PRIORITY, rotary_embedding,
    ),
]

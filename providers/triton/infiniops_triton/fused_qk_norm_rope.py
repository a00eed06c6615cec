"""FusedQkNormRope as one Triton kernel: per-head RmsNorm, then RoPE, of the Q and K heads of a packed QKV.

``qkv`` is ``[T, (Hq + 2*Hkv) * D]``: Q heads, then K heads, then V heads, each ``D`` wide. A program takes
``BLOCK_H`` consecutive Q/K heads of one token and reads each head once, in three tiles: the first and the
second channel of each rotary pair (channels ``i`` and ``i + R/2`` for NeoX, ``2i`` and ``2i + 1`` for GPT-J)
and the channels past ``R = rotary_dim`` that pass through. The fp32 mean square over the three tiles
normalizes every channel (times ``q_weight`` or ``k_weight``, in fp32), then the pairs turn by the token's
cosines and sines in fp32 and each channel is stored rounded once, as vLLM's kernel does. A position outside
``[0, max_position)`` (unchecked mode) reads no cache row and stores the normalized heads unturned. The V
columns are never loaded nor stored: one pass over the Q and K bytes, where the separate operators make two.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from infiniops_py import Between, Capability, Implementation, OneOf
from infiniops_triton._common import PRIORITY, base_constraints, cdiv, next_power_of_2, pdl, pdl_start
from infiniops_triton._fastlaunch import Launcher

__all__ = ["IMPLEMENTATIONS", "fused_qk_norm_rope"]

MAX_HEAD_DIM = 1024
_ELEMS_PER_PROGRAM = 2048  # heads per program grow until a program holds this many elements


@triton.jit
def _qk_norm_rope_kernel(
    QKV,  # *dtype [T, (Hq + 2*Hkv) * D], rows `stride_t` apart, unit column stride; Q/K heads updated
    QW,  # *dtype [D] q_norm weight
    KW,  # *dtype [D] k_norm weight
    CACHE,  # *cache_dtype [max_position, 2 * HALF] contiguous: cos values, then sin values, per row
    POS,  # *int64 [T] positions, `stride_p` apart
    stride_t,
    stride_p,
    num_q_heads,
    num_qk_heads,  # Hq + Hkv: the heads this kernel touches
    D,
    eps,
    max_position,
    HALF,  # rotary_dim / 2: the pairs per head
    IS_NEOX: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_R: tl.constexpr,  # next_power_of_2(HALF)
    BLOCK_P: tl.constexpr,  # next_power_of_2(D - 2 * HALF): the pass-through channels (0: none)
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    token = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_mask = (heads < num_qk_heads)[:, None]
    is_q = (heads < num_q_heads)[:, None]
    rows = QKV + token * stride_t + heads[:, None].to(tl.int64) * D
    pairs = tl.arange(0, BLOCK_R)
    pair_cols = pairs < HALF
    dtype = QKV.dtype.element_ty
    if IS_NEOX:  # the pair halves are two contiguous runs of channels
        mask = head_mask & pair_cols[None, :]
        x = tl.load(rows + pairs[None, :], mask=mask, other=0.0).to(tl.float32)
        y = tl.load(rows + HALF + pairs[None, :], mask=mask, other=0.0).to(tl.float32)
        wx = tl.where(is_q, tl.load(QW + pairs, mask=pair_cols, other=0.0)[None, :],
                      tl.load(KW + pairs, mask=pair_cols, other=0.0)[None, :]).to(tl.float32)
        wy = tl.where(is_q, tl.load(QW + HALF + pairs, mask=pair_cols, other=0.0)[None, :],
                      tl.load(KW + HALF + pairs, mask=pair_cols, other=0.0)[None, :]).to(tl.float32)
    else:  # interleaved pairs: one contiguous run of 2 * HALF channels, split into its even and odd ones
        channels = tl.arange(0, 2 * BLOCK_R)
        turned_cols = channels < 2 * HALF
        mask = head_mask & turned_cols[None, :]
        xy = tl.load(rows + channels[None, :], mask=mask, other=0.0).to(tl.float32)
        x, y = tl.split(tl.reshape(xy, (BLOCK_H, BLOCK_R, 2)))
        w = tl.where(is_q, tl.load(QW + channels, mask=turned_cols, other=0.0)[None, :],
                     tl.load(KW + channels, mask=turned_cols, other=0.0)[None, :]).to(tl.float32)
        wx, wy = tl.split(tl.reshape(w, (BLOCK_H, BLOCK_R, 2)))
    squares = tl.sum(x * x, axis=1) + tl.sum(y * y, axis=1)
    if BLOCK_P > 0:
        rest = 2 * HALF + tl.arange(0, BLOCK_P)
        rest_mask = head_mask & (rest < D)[None, :]
        p = tl.load(rows + rest[None, :], mask=rest_mask, other=0.0).to(tl.float32)
        squares += tl.sum(p * p, axis=1)
    rstd = tl.rsqrt(squares / D + eps)[:, None]
    x = x * rstd * wx
    y = y * rstd * wy
    if BLOCK_P > 0:
        rest_w = rest < D
        wp = tl.where(is_q, tl.load(QW + rest, mask=rest_w, other=0.0)[None, :],
                      tl.load(KW + rest, mask=rest_w, other=0.0)[None, :]).to(tl.float32)
        tl.store(rows + rest[None, :], (p * rstd * wp).to(dtype), mask=rest_mask)
    position = tl.load(POS + token * stride_p)
    valid = (position >= 0) & (position < max_position)
    position = tl.where(valid, position, 0)
    cos = tl.load(CACHE + position * (2 * HALF) + pairs, mask=valid & pair_cols, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(CACHE + position * (2 * HALF) + HALF + pairs, mask=valid & pair_cols,
                  other=0.0).to(tl.float32)[None, :]
    turned_x = tl.where(valid, x * cos - y * sin, x)
    turned_y = tl.where(valid, y * cos + x * sin, y)
    if IS_NEOX:
        tl.store(rows + pairs[None, :], turned_x.to(dtype), mask=mask)
        tl.store(rows + HALF + pairs[None, :], turned_y.to(dtype), mask=mask)
    else:
        turned = tl.reshape(tl.join(turned_x, turned_y), (BLOCK_H, 2 * BLOCK_R))
        tl.store(rows + channels[None, :], turned.to(dtype), mask=mask)


_QK_NORM_ROPE = Launcher(_qk_norm_rope_kernel)


def fused_qk_norm_rope(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float,
    is_neox: bool,
) -> None:
    """RmsNorm over ``head_dim`` of every Q and K head of `qkv`, then RoPE at `positions`, in place.

    Args:
        qkv: ``[T, (num_q_heads + 2*num_kv_heads) * head_dim]`` float16/bfloat16/float32, unit last stride.
        q_weight, k_weight: ``[head_dim]``, same dtype.
        cos_sin_cache: ``[max_position, rotary_dim]`` contiguous, qkv's dtype or float32.
        positions: int64 ``[T]``; a value outside ``[0, max_position)`` leaves its token normalized, unturned.
        num_q_heads, num_kv_heads, head_dim: the packing of `qkv`.
        eps: added to the fp32 mean square.
        is_neox: rotate-halves pairs (True) or interleaved pairs (False).

    Raises:
        ValueError: ``head_dim > MAX_HEAD_DIM`` (the capability gates it first).
    """
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"triton fused_qk_norm_rope: head_dim {head_dim} > {MAX_HEAD_DIM}; use the torch provider")
    tokens = qkv.shape[0]
    qk_heads = num_q_heads + num_kv_heads
    if tokens == 0:
        return
    max_position, rotary_dim = cos_sin_cache.shape
    half = rotary_dim // 2
    block_h, block_r, block_p, num_warps = launch_params(qk_heads, head_dim, rotary_dim)
    _QK_NORM_ROPE((tokens, cdiv(qk_heads, block_h)),
        qkv, q_weight, k_weight, cos_sin_cache, positions, qkv.stride(0), positions.stride(0), num_q_heads, qk_heads,
        head_dim, eps, max_position, half, IS_NEOX=is_neox, BLOCK_H=block_h, BLOCK_R=block_r, BLOCK_P=block_p,
        num_warps=num_warps, **pdl(),
    )


@functools.lru_cache(maxsize=1024)  # a pure function of a model's few head shapes (issue #25: host cost)
def launch_params(qk_heads: int, head_dim: int, rotary_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_H, BLOCK_R, BLOCK_P, num_warps) for `qk_heads` Q and K heads of `head_dim` channels, the first
    `rotary_dim` of them rotated: every value a power of two (BLOCK_P 0 without a pass-through part)."""
    block_r = next_power_of_2(rotary_dim // 2)
    block_p = next_power_of_2(head_dim - rotary_dim) if head_dim > rotary_dim else 0
    per_head = 2 * block_r + block_p
    fit = max(1, _ELEMS_PER_PROGRAM // per_head)
    block_h = min(next_power_of_2(qk_heads), 1 << (fit.bit_length() - 1))  # a power of two <= fit
    # 16-byte vectors: 8 elements per thread, rounded down to a power of two (per_head is none with a partial
    # rotary: D 80, rotary_dim 20 gives 16 + 16 + 64)
    warps = min(8, max(1, block_h * per_head // 512))
    return block_h, block_r, block_p, 1 << (warps.bit_length() - 1)


IMPLEMENTATIONS = [
    Implementation(
        "fused_qk_norm_rope", "triton", "triton.fused_qk_norm_rope",
        Capability(
            *base_constraints(),
            OneOf("dtype", ("float16", "bfloat16", "float32")),
            Between("head_dim", 1, MAX_HEAD_DIM, fix="use the torch provider for wider heads"),
        ),
        PRIORITY, fused_qk_norm_rope,
    ),
]

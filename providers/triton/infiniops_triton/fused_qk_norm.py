"""FusedQkNorm as one Triton kernel: per-head RmsNorm of the Q and K heads of a packed QKV, in place.

``qkv`` is ``[T, (Hq + 2*Hkv) * D]``: Q heads, then K heads, then V heads, each ``D`` wide. A program
normalizes ``BLOCK_H`` consecutive Q/K heads of one token (a ``[BLOCK_H, BLOCK_D]`` tile, one fp32 mean
square per head) with ``q_weight`` for Q heads and ``k_weight`` for K heads; the V columns are never
loaded nor stored, so they stay bit-for-bit untouched. One pass over the Q and K bytes, instead of the two
separate norms (and their gathers) of vLLM's unfused path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infiniops_py import Between, Capability, Implementation, OneOf
from infiniops_triton._common import PRIORITY, base_constraints, cdiv, next_power_of_2
from infiniops_triton._fastlaunch import Launcher

__all__ = ["IMPLEMENTATIONS", "fused_qk_norm"]

MAX_HEAD_DIM = 1024
_ELEMS_PER_PROGRAM = 2048  # heads per program grow until a program holds this many elements


@triton.jit
def _qk_norm_kernel(
    QKV,  # *dtype [T, (Hq + 2*Hkv) * D], rows `stride_t` apart, unit column stride; Q/K heads updated
    QW,  # *dtype [D] q_norm weight
    KW,  # *dtype [D] k_norm weight
    stride_t,
    num_q_heads,
    num_qk_heads,  # Hq + Hkv: the heads this kernel touches
    D,
    eps,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_D)
    mask = (heads[:, None] < num_qk_heads) & (cols[None, :] < D)
    ptrs = QKV + token * stride_t + heads[:, None] * D + cols[None, :]
    x = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)
    qw = tl.load(QW + cols, mask=cols < D, other=0.0).to(tl.float32)
    kw = tl.load(KW + cols, mask=cols < D, other=0.0).to(tl.float32)
    w = tl.where((heads < num_q_heads)[:, None], qw[None, :], kw[None, :])
    y = (x * rstd[:, None]).to(QKV.dtype.element_ty).to(tl.float32) * w
    tl.store(ptrs, y.to(QKV.dtype.element_ty), mask=mask)


_QK_NORM = Launcher(_qk_norm_kernel)


def fused_qk_norm(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float,
) -> None:
    """RmsNorm over ``head_dim`` of every Q head (``q_weight``) and K head (``k_weight``) of `qkv`, in place.

    Matches vLLM's per-head ``q_norm``/``k_norm`` (Qwen3): fp32 mean square, the normalized value rounded
    to the dtype, then multiplied by the weight.

    Args:
        qkv: ``[T, (num_q_heads + 2*num_kv_heads) * head_dim]`` float16/bfloat16/float32, unit last stride.
        q_weight, k_weight: ``[head_dim]``, same dtype.
        num_q_heads, num_kv_heads, head_dim: the packing of `qkv`.
        eps: added to the fp32 mean square.

    Raises:
        ValueError: ``head_dim > MAX_HEAD_DIM`` (the capability gates it first).
    """
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"triton fused_qk_norm: head_dim {head_dim} > {MAX_HEAD_DIM}; use the torch provider")
    tokens = qkv.shape[0]
    qk_heads = num_q_heads + num_kv_heads
    if tokens == 0 or qk_heads == 0 or head_dim == 0:
        return
    block_d = next_power_of_2(head_dim)
    block_h = min(next_power_of_2(qk_heads), max(1, _ELEMS_PER_PROGRAM // block_d))
    num_warps = min(8, max(2, block_h * block_d // 256))
    grid = (tokens, cdiv(qk_heads, block_h))
    _QK_NORM(grid,
        qkv, q_weight, k_weight, qkv.stride(0), num_q_heads, qk_heads, head_dim, eps,
        BLOCK_H=block_h, BLOCK_D=block_d, num_warps=num_warps,
    )


IMPLEMENTATIONS = [
    Implementation(
        "fused_qk_norm", "triton", "triton.fused_qk_norm",
        Capability(
            *base_constraints(),
            OneOf("dtype", ("float16", "bfloat16", "float32")),
            Between("head_dim", 1, MAX_HEAD_DIM, fix="use the torch provider for wider heads"),
        ),
        PRIORITY, fused_qk_norm,
    ),
]

"""Strategies for FusedQkNorm, after vLLM's ``test_fused_qk_norm_rope`` (Hq=16, Hkv=4, D=128, eps {1e-5, 1e-6}).

Head dims, Q and KV head counts around the peer's (and Qwen3's) values, tokens up to 64, weights
~ N(1, 0.1), rows sometimes strided (the packed qkv a column slice of a wider buffer). The V columns must
come back bit for bit (`Case.untouched`).

On `CaseContext.large` (GPU) runs, head dims 64, 128 and 256 are favored, Q heads reach 64 (Qwen3's 32/8
and the peer's 16/4 among the draws) and tokens 4096, with at most 2**24 elements in the packed qkv.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from hypothesis import strategies as st

from infiniops_py.testing.case import Case, CaseContext, randn

__all__ = ["STRATEGIES", "PackedQkv", "eps", "head_dim", "packed_qkv"]

_HEAD_DIMS = (64, 80, 96, 128, 256)
_Q_HEADS = (1, 2, 4, 8, 16, 32)
_KV_HEADS = (1, 2, 4, 8)
_TOKENS = (1, 3, 7, 16, 64)
_EPS = (1e-6, 1e-5)
# large (GPU) runs
_GRID_HEAD_DIMS = (64, 128, 256)
_LARGE_Q_HEADS = (*_Q_HEADS, 64)
_LARGE_TOKENS = (*_TOKENS, 83, 256, 1024, 4096)
_LARGE_ELEMENTS = 2**24


class PackedQkv(NamedTuple):
    """A packed projection ``[T, (Hq + 2*Hkv) * D]`` (rows maybe strided), its sizes, and q/k norm weights."""

    qkv: torch.Tensor
    tokens: int
    num_q_heads: int
    num_kv_heads: int
    weights: torch.Tensor  # [2, D]: q_norm's, then k_norm's


def head_dim(ctx: CaseContext) -> int:
    """A head dim around the peer's (the grid's 64/128/256 favored on large runs)."""
    return ctx.pick("head_dim", _HEAD_DIMS, _GRID_HEAD_DIMS)


def packed_qkv(ctx: CaseContext, gen: torch.Generator, d: int) -> PackedQkv:
    """Q and KV head counts, tokens (bounded by `_LARGE_ELEMENTS` on large runs), a packed qkv of head dim `d`
    whose rows are sometimes a column slice of a wider buffer, and weights ~ N(1, 0.1)."""
    hq = ctx.pick("num_q_heads", _LARGE_Q_HEADS if ctx.large else _Q_HEADS)
    hkv = ctx.pick("num_kv_heads", _KV_HEADS)
    width = (hq + 2 * hkv) * d
    if ctx.large:
        t = ctx.draw(st.sampled_from([n for n in _LARGE_TOKENS if n * width <= _LARGE_ELEMENTS] or [1]))
    else:
        t = ctx.draw(st.sampled_from(_TOKENS))
    pad = ctx.draw(st.sampled_from((0, 0, d)))  # a wider row buffer: strided rows
    qkv = randn(t, width + pad, dtype=ctx.dtype, device=ctx.device, generator=gen)[:, :width]
    weights = (torch.randn(2, d, generator=gen) * 0.1 + 1.0).to(device=ctx.device, dtype=ctx.dtype)
    return PackedQkv(qkv, t, hq, hkv, weights)


def eps(ctx: CaseContext) -> float:
    """One of the peer's epsilons."""
    return ctx.draw(st.sampled_from(_EPS))


def fused_qk_norm_case(ctx: CaseContext) -> Case:
    gen = ctx.generator()
    d = head_dim(ctx)
    qkv, t, hq, hkv, weights = packed_qkv(ctx, gen, d)
    eps_ = eps(ctx)
    v_columns = (slice(None), slice((hq + hkv) * d, None))
    return Case(
        (qkv, weights[0], weights[1]),
        {"num_q_heads": hq, "num_kv_heads": hkv, "head_dim": d, "eps": eps_},
        mutated=(0,),
        untouched=((0, v_columns),),
        note=f"T={t} Hq={hq} Hkv={hkv} D={d} row stride {qkv.stride(0)} eps={eps_}",
    )


STRATEGIES = {"fused_qk_norm": fused_qk_norm_case}

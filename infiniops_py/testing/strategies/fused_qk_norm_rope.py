"""Strategies for FusedQkNormRope, after vLLM's ``test_fused_qk_norm_rope`` (Hq=16, Hkv=4, D=128, eps
{1e-5, 1e-6}, NeoX and GPT-J, rotary ratios 1, 0.5 and 0.25, cache in the activations' dtype).

Head dims, Q and KV head counts around the peer's (and Qwen3's) values, tokens up to 64, weights
~ N(1, 0.1), rows sometimes strided (the packed qkv a column slice of a wider buffer), rotary dim the head dim,
half or a quarter of it; the cache holds the true cosines and sines (theta 10000) of up to 4096 positions, in
qkv's dtype or in float32. The V columns must come back bit for bit (`Case.untouched`).

On `CaseContext.large` (GPU) runs, head dims 64, 128 and 256 are favored, Q heads reach 64 (Qwen3-0.6B's 16/8
and the peer's 16/4 among the draws) and tokens 4096, with at most 2**24 elements in the packed qkv.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from infiniops_py.testing.case import Case, CaseContext, randn
from infiniops_py.testing.strategies.rotary_embedding import cos_sin_cache

__all__ = ["STRATEGIES"]

_HEAD_DIMS = (64, 80, 96, 128, 256)
_Q_HEADS = (1, 2, 4, 8, 16, 32)
_KV_HEADS = (1, 2, 4, 8)
_TOKENS = (1, 3, 7, 16, 64)
_EPS = (1e-6, 1e-5)
_POSITIONS = (16, 256, 4096)
# large (GPU) runs
_GRID_HEAD_DIMS = (64, 128, 256)
_LARGE_Q_HEADS = (*_Q_HEADS, 64)
_LARGE_TOKENS = (*_TOKENS, 83, 256, 1024, 4096)
_LARGE_ELEMENTS = 2**24


def _rotary_dims(head_dim: int) -> tuple[int, ...]:
    """The peer's rotary ratios 1, 0.5 and 0.25 of `head_dim` (the even ones)."""
    return tuple(sorted({r for r in (head_dim, head_dim // 2, head_dim // 4) if r % 2 == 0 and r >= 2}))


def fused_qk_norm_rope_case(ctx: CaseContext) -> Case:
    gen = ctx.generator()
    d = ctx.pick("head_dim", _HEAD_DIMS, _GRID_HEAD_DIMS)
    rotary_dim = ctx.pick("rotary_dim", _rotary_dims(d))
    is_neox = ctx.pick("is_neox", (True, False))
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
    rows = ctx.draw(st.sampled_from(_POSITIONS))
    cache_dtype = ctx.draw(st.sampled_from((ctx.dtype, torch.float32)))
    cache = cos_sin_cache(ctx, rows, rotary_dim, cache_dtype)
    positions = torch.randint(0, rows, (t,), generator=gen).to(ctx.device)
    eps = ctx.draw(st.sampled_from(_EPS))
    v_columns = (slice(None), slice((hq + hkv) * d, None))
    return Case(
        (qkv, weights[0], weights[1], cache, positions),
        {"num_q_heads": hq, "num_kv_heads": hkv, "head_dim": d, "eps": eps, "is_neox": is_neox},
        mutated=(0,),
        untouched=((0, v_columns),),
        note=f"T={t} Hq={hq} Hkv={hkv} D={d} rotary_dim={rotary_dim} {'neox' if is_neox else 'gptj'} row stride "
             f"{qkv.stride(0)} eps={eps} max_position={rows} cache {str(cache_dtype).removeprefix('torch.')}",
    )


STRATEGIES = {"fused_qk_norm_rope": fused_qk_norm_rope_case}

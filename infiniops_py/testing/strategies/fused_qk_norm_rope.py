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

from infiniops_py.testing.case import Case, CaseContext
from infiniops_py.testing.strategies.fused_qk_norm import eps, head_dim, packed_qkv
from infiniops_py.testing.strategies.rotary_embedding import cos_sin_cache

__all__ = ["STRATEGIES"]

_POSITIONS = (16, 256, 4096)


def _rotary_dims(d: int) -> tuple[int, ...]:
    """The peer's rotary ratios 1, 0.5 and 0.25 of the head dim `d` (the even ones)."""
    return tuple(sorted({r for r in (d, d // 2, d // 4) if r % 2 == 0 and r >= 2}))


def fused_qk_norm_rope_case(ctx: CaseContext) -> Case:
    gen = ctx.generator()
    d = head_dim(ctx)
    rotary_dim = ctx.pick("rotary_dim", _rotary_dims(d))
    is_neox = ctx.pick("is_neox", (True, False))
    qkv, t, hq, hkv, weights = packed_qkv(ctx, gen, d)
    rows = ctx.draw(st.sampled_from(_POSITIONS))
    cache_dtype = ctx.draw(st.sampled_from((ctx.dtype, torch.float32)))
    cache = cos_sin_cache(ctx, rows, rotary_dim, cache_dtype)
    positions = torch.randint(0, rows, (t,), generator=gen).to(ctx.device)
    eps_ = eps(ctx)
    v_columns = (slice(None), slice((hq + hkv) * d, None))
    return Case(
        (qkv, weights[0], weights[1], cache, positions),
        {"num_q_heads": hq, "num_kv_heads": hkv, "head_dim": d, "eps": eps_, "is_neox": is_neox},
        mutated=(0,),
        untouched=((0, v_columns),),
        note=f"T={t} Hq={hq} Hkv={hkv} D={d} rotary_dim={rotary_dim} {'neox' if is_neox else 'gptj'} row stride "
             f"{qkv.stride(0)} eps={eps_} max_position={rows} cache {str(cache_dtype).removeprefix('torch.')}",
    )


STRATEGIES = {"fused_qk_norm_rope": fused_qk_norm_rope_case}

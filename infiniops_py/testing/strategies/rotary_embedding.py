"""Strategies for RoPE, after vLLM's ``test_pos_encoding`` (head sizes {64, 80, 120, 256}, rotary dim the head
size or 32, 17 heads, NeoX and GPT-J, with and without key, flat, 3-D and padded-head layouts, 8192 positions).

Head sizes the peer's and Qwen3's 128, rotary dim the head size, half of it or 32 (partial rotary), Q heads
up to the peer's 17 and KV heads up to 8, tokens up to 64; query and key either views of one packed QKV
projection (strided rows: V and the row padding must come back bit for bit), separate 2-D tensors, 3-D
``[T, H, D]`` views or vLLM's padded heads ``[T, H, D + 16][..., :D]``; now and then no key. The cache holds
the true cosines and sines (theta 10000) for up to 4096 positions, in the query's dtype or in float32, and
positions are drawn over all of it; the channels past the rotary dim must come back bit for bit.

On `CaseContext.large` (GPU) runs, head dims 64, 128 and 256 are favored, Q heads reach 64 (Qwen3-0.6B's 16/8
among the draws), tokens 4096 and the cache 32768 positions, with at most 2**24 elements in the packed QKV.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from infiniops_py.testing.case import Case, CaseContext, randn

__all__ = ["STRATEGIES", "cos_sin_cache", "rotary_dims"]

_HEAD_DIMS = (64, 80, 120, 128, 256)
_Q_HEADS = (1, 2, 4, 8, 16, 17)
_KV_HEADS = (1, 2, 4, 8)
_TOKENS = (1, 3, 7, 16, 64)
_POSITIONS = (16, 256, 4096)
# large (GPU) runs
_GRID_HEAD_DIMS = (64, 128, 256)
_LARGE_Q_HEADS = (*_Q_HEADS, 32, 64)
_LARGE_TOKENS = (*_TOKENS, 83, 256, 1024, 4096)
_LARGE_POSITIONS = (*_POSITIONS, 32768)
_LARGE_ELEMENTS = 2**24


def rotary_dims(head_dim: int) -> tuple[int, ...]:
    """The rotary dims drawn for `head_dim`: the whole head, half of it, and vLLM's 32 (the even ones)."""
    return tuple(sorted({r for r in (head_dim, head_dim // 2, 32) if r % 2 == 0 and 2 <= r <= head_dim}))


def cos_sin_cache(ctx: CaseContext, rows: int, rotary_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """vLLM's cache ``[rows, rotary_dim]``: the cosines, then the sines, of ``p * 10000**(-2i / rotary_dim)``,
    computed in float64 on the CPU and cast to `dtype` on ``ctx.device``."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    angles = torch.arange(rows, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1).to(device=ctx.device, dtype=dtype)


def _heads(ctx: CaseContext, gen: torch.Generator, t: int, h: int, d: int, layout: str) -> torch.Tensor:
    new = {"dtype": ctx.dtype, "device": ctx.device, "generator": gen}
    if layout == "3d":
        return randn(t, h, d, **new)
    if layout == "padded":  # vLLM's sliced heads: [T, H, D + 16][..., :D]
        return randn(t, h, d + 16, **new)[..., :d]
    return randn(t, h * d, **new)


def _passed(x: torch.Tensor, d: int, rotary_dim: int) -> tuple[object, ...]:
    """The index of `x`'s channels past `rotary_dim` (which must stay untouched), 2-D or 3-D alike."""
    if x.dim() == 3:
        return (Ellipsis, slice(rotary_dim, None))
    heads = x.shape[1] // d
    cols = [h * d + c for h in range(heads) for c in range(rotary_dim, d)]
    return (slice(None), torch.tensor(cols, dtype=torch.int64))


def rotary_embedding_case(ctx: CaseContext) -> Case:
    gen = ctx.generator()
    d = ctx.pick("head_dim", _HEAD_DIMS, _GRID_HEAD_DIMS)
    rotary_dim = ctx.pick("rotary_dim", rotary_dims(d))
    is_neox = ctx.pick("is_neox", (True, False))
    hq = ctx.pick("num_q_heads", _LARGE_Q_HEADS if ctx.large else _Q_HEADS)
    hkv = ctx.pick("num_kv_heads", _KV_HEADS)
    width = (hq + 2 * hkv) * d
    if ctx.large:
        t = ctx.draw(st.sampled_from([n for n in _LARGE_TOKENS if n * width <= _LARGE_ELEMENTS] or [1]))
    else:
        t = ctx.draw(st.sampled_from(_TOKENS))
    layout = ctx.draw(st.sampled_from(("packed", "packed", "packed-3d", "separate", "3d", "padded")))
    if layout.startswith("packed"):  # views of one [T, (Hq + 2 * Hkv) * D] projection, rows maybe padded
        pad = ctx.draw(st.sampled_from((0, 0, d)))
        qkv = randn(t, width + pad, dtype=ctx.dtype, device=ctx.device, generator=gen)
        query, key = qkv[:, : hq * d], qkv[:, hq * d : (hq + hkv) * d]
        if layout == "packed-3d":
            query, key = query.view(t, hq, d), key.view(t, hkv, d)
    else:
        query, key = _heads(ctx, gen, t, hq, d, layout), _heads(ctx, gen, t, hkv, d, layout)
    with_key = ctx.draw(st.sampled_from((True, True, True, False)))
    rows = ctx.draw(st.sampled_from(_LARGE_POSITIONS if ctx.large else _POSITIONS))
    cache_dtype = ctx.draw(st.sampled_from((ctx.dtype, torch.float32)))
    cache = cos_sin_cache(ctx, rows, rotary_dim, cache_dtype)
    positions = torch.randint(0, rows, (t,), generator=gen).to(ctx.device)
    untouched: list[tuple[int, tuple[object, ...]]] = []
    if rotary_dim < d:
        untouched.append((1, _passed(query, d, rotary_dim)))
        if with_key:
            untouched.append((2, _passed(key, d, rotary_dim)))
    note = (f"T={t} Hq={hq} Hkv={hkv if with_key else 0} D={d} rotary_dim={rotary_dim} "
            f"{'neox' if is_neox else 'gptj'} {layout} query{list(query.shape)} strides {list(query.stride())} "
            f"max_position={rows} cache {str(cache_dtype).removeprefix('torch.')}")
    return Case((positions, query, key if with_key else None, d, cache, is_neox), mutated=(1, 2) if with_key else (1,),
                untouched=tuple(untouched), note=note)


STRATEGIES = {"rotary_embedding": rotary_embedding_case}

"""Strategies for the paged-cache write, after vLLM's ``test_cache.py::test_reshape_and_cache_flash``.

Head dims {64, 80, 120, 128, 256} and block sizes {8, 16, 32} as the peer sweeps them; the cache cut
from 512+ blocks to a few more than the tokens need; unique random slots with some -1 padding; key rows
past the slot count (padding rows); key/value sometimes strided views of a packed qkv; caches NHD or an
HND buffer viewed as NHD, filled with random values so that every slot not written is checked too.
The written caches must be exact and key/value untouched. An fp8 cache (float8_e4m3fn, ``kv_cache_dtype``
"fp8" or "fp8_e4m3", the last three arguments positional as vLLM passes them or by name) gets scales of one
element: vLLM's ``amax / 64``, or one small enough that some values saturate at 448; an "auto" cache is now and
then passed vLLM's unused scales too.

On `CaseContext.large` (GPU) runs, head dims 64, 128 and 256 and block sizes 16 and 256 (the GPU
acceptance grid; 256 joins the peer's sizes) are favored, up to 2048 tokens (a prefill chunk) go into caches with up to
4096 spare slots, closer to the peer's 512+ blocks.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from infiniops_py.operators.flash_attn import FP8
from infiniops_py.testing.case import Case, CaseContext, randn

__all__ = ["STRATEGIES"]

_HEAD_DIMS = (64, 80, 120, 128, 256)
_BLOCK_SIZES = (8, 16, 32)
_KV_HEADS = (1, 2, 4, 8)
# large (GPU) runs
_GRID_HEAD_DIMS = (64, 128, 256)
_GRID_BLOCK_SIZES = (16, 256)
_LARGE_BLOCK_SIZES = (*_BLOCK_SIZES, 256)
_LARGE_TOKENS = (1, 7, 256, 2048)
_SPARE_SLOTS = 4096


def _key_value(ctx: CaseContext, gen: torch.Generator, t: int, hkv: int, d: int) -> tuple[torch.Tensor, ...]:
    if ctx.draw(st.booleans()):  # views of a packed [T, (Hq + 2 * Hkv) * D] projection
        hq = 2 * hkv
        qkv = randn(t, (hq + 2 * hkv) * d, dtype=ctx.dtype, device=ctx.device, generator=gen)
        k = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
        return k, qkv[:, (hq + hkv) * d :].view(t, hkv, d), qkv
    return (randn(t, hkv, d, dtype=ctx.dtype, device=ctx.device, generator=gen),
            randn(t, hkv, d, dtype=ctx.dtype, device=ctx.device, generator=gen), None)


def _cache(ctx: CaseContext, gen: torch.Generator, nb: int, bs: int, hkv: int, d: int, hnd: bool,
           dtype: torch.dtype) -> torch.Tensor:
    if hnd:
        return randn(nb, hkv, bs, d, dtype=dtype, device=ctx.device, generator=gen).transpose(1, 2)
    return randn(nb, bs, hkv, d, dtype=dtype, device=ctx.device, generator=gen)


def _scales(ctx: CaseContext, gen: torch.Generator, key: torch.Tensor, value: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """One-element float32 scales: vLLM's test rule ``amax / 64``, or small enough that values saturate."""
    out = []
    for x in (key, value):
        amax = float(x.float().abs().amax()) if x.numel() else 1.0
        s = max(amax, 1e-3) / ctx.draw(st.sampled_from((64.0, 64.0, 1000.0)))
        shape = ctx.draw(st.sampled_from(((), (1,))))
        out.append(torch.full(shape, s, dtype=torch.float32, device=ctx.device))
    return out[0], out[1]


def reshape_and_cache_flash_case(ctx: CaseContext) -> Case:
    gen = ctx.generator()
    d = ctx.pick("head_dim", _HEAD_DIMS, _GRID_HEAD_DIMS)
    bs = ctx.pick("block_size", _LARGE_BLOCK_SIZES if ctx.large else _BLOCK_SIZES, _GRID_BLOCK_SIZES)
    hkv = ctx.pick("num_kv_heads", _KV_HEADS)
    if ctx.large:
        n = ctx.draw(st.one_of(st.sampled_from(_LARGE_TOKENS), st.integers(1, 2048)))
        spare = ctx.draw(st.integers(0, max(3, _SPARE_SLOTS // bs)))
    else:
        n = ctx.draw(st.integers(1, 64))
    ctx.record("max_tokens", n)
    t = n + ctx.draw(st.sampled_from((0, 0, 1, 3)))
    nb = -(-n // bs) + (spare if ctx.large else ctx.draw(st.integers(0, 3)))
    key, value, packed = _key_value(ctx, gen, t, hkv, d)
    fp8 = ctx.pick("fp8_kv", (False, True))
    hnd = ctx.draw(st.booleans())
    key_cache, value_cache = (_cache(ctx, gen, nb, bs, hkv, d, hnd, FP8 if fp8 else ctx.dtype) for _ in range(2))
    slots = torch.randperm(nb * bs, generator=gen)[:n]
    padding = torch.rand(n, generator=gen) < ctx.draw(st.sampled_from((0.0, 0.125, 0.5)))
    slots = slots.masked_fill(padding, -1).to(ctx.device)
    args: tuple[object, ...] = (key, value, key_cache, value_cache, slots)
    kwargs: dict[str, object] = {}
    kv_cache_dtype = ctx.draw(st.sampled_from(("fp8", "fp8_e4m3"))) if fp8 else "auto"
    if fp8 or ctx.draw(st.booleans()):
        k_scale, v_scale = _scales(ctx, gen, key[:n], value[:n])
        if ctx.draw(st.booleans()):
            args = (*args, kv_cache_dtype, k_scale, v_scale)  # vLLM's positional order
        else:
            kwargs = {"kv_cache_dtype": kv_cache_dtype, "k_scale": k_scale, "v_scale": v_scale}
    note = (f"T={t} N={n} Hkv={hkv} D={d} block_size={bs} blocks={nb} {'HND' if hnd else 'NHD'}"
            f"{' packed' if packed is not None else ''} padding={int(padding.sum())} kv_cache_dtype={kv_cache_dtype}")
    return Case(args, kwargs, mutated=(2, 3), exact=(0, 1), note=note)


STRATEGIES = {"reshape_and_cache_flash": reshape_and_cache_flash_case}

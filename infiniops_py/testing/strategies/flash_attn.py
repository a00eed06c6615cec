"""Strategies for FlashAttention, after flash-attention's ``test_flash_attn.py`` (varlen and kvcache tests)
and vLLM's ``test_flash_attn.py``, scaled down for the CPU (at most ~600 query + key tokens per case).

Head dims from flash-attention's sweep; (Sq, Sk) pairs including (1, 147) and (113, 203), Sq > Sk (empty
causal rows) and small ones; 1 to 4 sequences of random lengths, one of them at the maximum; MHA, GQA and
MQA; causal; local windows, one side now and then at or past the keys (flash-attention's normalization);
softcap {0, 50}; queries now and then scaled x8 (large logits); paged K/V with block sizes {16, 32, 256}, a
shuffled block table whose unused entries are 0 or -1 padding, caches in NHD or HND (a strided view)
layout. The kvcache cases decode 1 to 3 queries per sequence over 0 to 339 cached tokens, appending new k/v
or not (passed positionally or by name), with ``cache_seqlens`` a tensor, one int or None (full caches).
Cache rows past every sequence (and left padding) hold NaN, which must never reach an output.

The arguments beyond flash-attention 2's core, each a problem field drawn like the others (`CaseContext.pick`):
ALiBi slopes ``rand * 0.3`` (flash-attention's test) as ``[Hq]`` or ``[B, Hq]``; ``return_softmax_lse``; an fp8
KV cache (float8_e4m3fn, with or without ``[B, Hkv]`` descales in [0.25, 2]); varlen's ``seqused_k`` (each
sequence uses 0 to all of its keys); kvcache's ``cache_batch_idx`` (a permutation into up to 2 spare cache
rows), ``cache_leftpad`` (0 to all of the cached tokens) and rotary tables (random angles, rotary_dim the
whole head dim, half of it rounded to even, or 16; interleaved or NeoX).

On `CaseContext.large` (GPU) runs, the GPU acceptance grid: head dims 64, 128 and 256, GQA ratios 1, 4 and 8 and
block sizes 16 and 256 are favored (half the draws), block sizes 64 and 128 join, (Sq, Sk) pairs reach
flash-attention's (512, 256), (1023, 1024) and (2048, 2048) with up to 8 sequences (8192 tokens), up to
32 query heads, and kvcache decodes 1 to 16 queries over up to 4096 cached tokens, batches up to 16. One
case in ten holds one long sequence (2048 to 8192 tokens, the grid's maximum) beside up to three
short ones; it has at most 8 query heads and k/v caches of at most 2**25 elements, which bounds the
float64 reference (see `reference_varlen`'s blocks of query rows) and the case's memory.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from infiniops_py.operators.flash_attn import FP8
from infiniops_py.testing.case import Case, CaseContext, randn

__all__ = ["STRATEGIES"]

_HEAD_DIMS = (32, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256)
_GQA_RATIOS = (1, 2, 4, 8)
_BLOCK_SIZES = (16, 32, 256)
_VARLEN_SHAPES = ((1, 1), (1, 147), (3, 7), (8, 8), (17, 9), (40, 40), (64, 37), (113, 203), (128, 128))
_CACHED = (0, 5, 20, 128, 147, 339)
_MAX_TOKENS = 600
# large (GPU) runs: the GPU acceptance grid, favored; more and longer sequences; one long sequence in ten cases
_GRID_HEAD_DIMS = (64, 128, 256)
_GRID_GQA_RATIOS = (1, 4, 8)
_GRID_BLOCK_SIZES = (16, 256)
_LARGE_BLOCK_SIZES = (16, 32, 64, 128, 256)
_LARGE_VARLEN_SHAPES = (*_VARLEN_SHAPES, (512, 256), (1023, 1024), (1, 2048), (2048, 2048))
_LARGE_CACHED = (*_CACHED, 1024, 2047, 4096)
_LARGE_SQ = (1, 1, 1, 2, 3, 4, 16)
_LARGE_TOKENS = 8192  # query + key tokens of a case without a long sequence
_LONG = (2048, 4096, 4097, 8191, 8192)
_SHORT = 512  # the other sequences of a long case
_LONG_HEADS = 8  # query heads of a long case
_MAX_HEADS = 32
_CACHE_ELEMENTS = 2**25  # per k or v cache of a large case


def _heads(ctx: CaseContext, max_hq: int) -> tuple[int, int]:
    ratio = ctx.pick("gqa_ratio", _GQA_RATIOS, _GRID_GQA_RATIOS)
    if ctx.large:
        hkv = ctx.draw(st.sampled_from([n for n in (1, 2, 4, 8) if ratio * n <= max_hq] or [1]))
    else:
        hkv = 1 if ratio == 8 else ctx.draw(st.sampled_from((1, 2)))
    return ratio * hkv, hkv


def _window(ctx: CaseContext, causal: bool, max_sk: int) -> tuple[int, int]:
    """A local window; a side is now and then -1 or at or past `max_sk` (flash-attention then sets the other
    side's -1 to `max_sk`: the first query rows stay clipped when Sq > Sk + 1)."""
    if not ctx.pick("local", (False, True)) or max_sk < 2:
        return (-1, -1)
    bound = st.integers(0, max_sk - 1)
    side = st.one_of(st.just(-1), bound, bound, st.integers(max_sk, max_sk + 8))
    if causal:
        return (ctx.draw(bound), -1)
    left, right = ctx.draw(side), ctx.draw(side)
    return (ctx.draw(bound), right) if left == right == -1 else (left, right)


def _flags(ctx: CaseContext, max_hq: int = _MAX_HEADS) -> tuple[int, int, int, bool, float, int]:
    """head_dim, Hq, Hkv, causal, softcap, block_size (0: not paged)."""
    d = ctx.pick("head_dim", _HEAD_DIMS, _GRID_HEAD_DIMS)
    hq, hkv = _heads(ctx, max_hq)
    causal = ctx.pick("causal", (False, True))
    softcap = 50.0 if ctx.pick("softcap", (False, True)) else 0.0
    sizes = _LARGE_BLOCK_SIZES if ctx.large else _BLOCK_SIZES
    block_size = ctx.pick("block_size", sizes, _GRID_BLOCK_SIZES) if ctx.pick("paged", (False, True)) else 0
    return d, hq, hkv, causal, softcap, block_size


def _long(ctx: CaseContext) -> bool:
    """On large runs, one case in ten holds a long sequence."""
    return ctx.large and ctx.draw(st.integers(0, 9)) == 0


def _with_long(ctx: CaseContext, longest: int, shorts: int, low: int = 0) -> tuple[list[int], int]:
    """`shorts` random lengths in [low, min(_SHORT, longest)] and `longest` among them; its position."""
    out = [ctx.draw(st.integers(low, min(_SHORT, longest))) for _ in range(shorts)]
    at = ctx.draw(st.integers(0, shorts))
    out.insert(at, longest)
    return out, at


def _q_scale(ctx: CaseContext) -> float:
    """Now and then large logits (|s| ~ 10): peaked softmax rows, and a softcap of 50 that bites."""
    return ctx.draw(st.sampled_from((1.0, 1.0, 8.0)))


def _lengths(ctx: CaseContext, n: int, longest: int, low: int = 0) -> list[int]:
    """`n` random lengths in [low, longest], one of them exactly `longest`."""
    out = [ctx.draw(st.integers(low, longest)) for _ in range(n)]
    out[ctx.draw(st.integers(0, n - 1))] = longest
    return out


def _paged_cache(ctx: CaseContext, gen: torch.Generator, lengths: list[int], capacity: int, block_size: int,
                 hkv: int, d: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """k/v caches in `dtype` holding `lengths` rows per sequence through a shuffled block table; NaN in unused
    rows."""
    used = [-(-n // block_size) for n in lengths]
    max_blocks = max(-(-capacity // block_size), 1)
    num_blocks = sum(used) + ctx.draw(st.integers(0, 2))
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.full((len(lengths), max_blocks), ctx.draw(st.sampled_from((0, -1))), dtype=torch.int32)
    filled = torch.full((num_blocks * block_size,), False)
    for b, (n, m) in enumerate(zip(lengths, used)):
        blocks, ids = ids[:m], ids[m:]
        table[b, :m] = torch.tensor(blocks, dtype=torch.int32)
        rows = (torch.tensor(blocks, dtype=torch.long)[:, None] * block_size + torch.arange(block_size)).flatten()[:n]
        filled[rows] = True
    hnd = ctx.draw(st.booleans())
    shape = (num_blocks, hkv, block_size, d) if hnd else (num_blocks, block_size, hkv, d)
    caches = []
    for _ in range(2):
        c = randn(*shape, dtype=torch.float32, device=torch.device("cpu"), generator=gen)
        c = c.transpose(1, 2) if hnd else c  # HND storage seen as an NHD view
        c[(~filled).view(num_blocks, block_size)] = float("nan")
        caches.append(c.to(device=ctx.device, dtype=dtype))  # keeps the strides (an fp8 cache: values ~N(0, 1))
    return caches[0], caches[1], table.to(ctx.device)


def _kv_dtype(ctx: CaseContext) -> torch.dtype:
    """The K/V (cache) dtype: q's, or now and then an fp8 cache."""
    return FP8 if ctx.pick("fp8_kv", (False, True)) else ctx.dtype


def _descales(ctx: CaseContext, gen: torch.Generator, batch: int, hkv: int, kv_dtype: torch.dtype
              ) -> dict[str, torch.Tensor]:
    """``k_descale`` / ``v_descale`` ``[B, Hkv]`` in [0.25, 2] of an fp8 cache, each now and then (None is 1)."""
    if kv_dtype != FP8:
        return {}
    return {name: (torch.rand(batch, hkv, generator=gen) * 1.75 + 0.25).to(ctx.device)
            for name in ("k_descale", "v_descale") if ctx.draw(st.booleans())}


def _alibi(ctx: CaseContext, gen: torch.Generator, batch: int, hq: int) -> dict[str, torch.Tensor]:
    """ALiBi slopes ``rand * 0.3`` (flash-attention's test), ``[Hq]`` or ``[B, Hq]``, now and then."""
    if not ctx.pick("alibi", (False, True)):
        return {}
    shape = (hq,) if ctx.draw(st.booleans()) else (batch, hq)
    return {"alibi_slopes": (torch.rand(shape, generator=gen) * 0.3).to(ctx.device)}


def _lse(ctx: CaseContext) -> dict[str, bool]:
    return {"return_softmax_lse": True} if ctx.pick("return_softmax_lse", (False, True)) else {}


def _varlen_lengths(ctx: CaseContext, long: bool) -> tuple[list[int], list[int], int, int]:
    """Query and key lengths per sequence, and their maxima."""
    if long:
        max_k = ctx.draw(st.sampled_from(_LONG))
        max_q = ctx.draw(st.one_of(st.just(max_k), st.integers(1, max_k)))
        shorts = ctx.draw(st.integers(0, 3))
        len_q, at = _with_long(ctx, max_q, shorts)
        len_k = [ctx.draw(st.integers(0, _SHORT)) for _ in range(shorts)]
        len_k.insert(at, max_k)  # the long queries attend the long keys
        return len_q, len_k, max(len_q), max(len_k)
    shapes, budget, most = (_LARGE_VARLEN_SHAPES, _LARGE_TOKENS, 8) if ctx.large else (_VARLEN_SHAPES, _MAX_TOKENS, 4)
    max_q, max_k = ctx.draw(st.sampled_from(shapes))
    batch = ctx.draw(st.integers(1, max(1, min(most, budget // (max_q + max_k)))))
    return _lengths(ctx, batch, max_q), _lengths(ctx, batch, max_k), max_q, max_k


def flash_attn_varlen_case(ctx: CaseContext) -> Case:
    gen = ctx.generator()
    long = _long(ctx)
    d, hq, hkv, causal, softcap, block_size = _flags(ctx, _LONG_HEADS if long else _MAX_HEADS)
    len_q, len_k, max_q, max_k = _varlen_lengths(ctx, long)
    kv_dtype = _kv_dtype(ctx)
    ctx.record("max_seqlen_q", max_q)
    ctx.record("max_seqlen_k", max_k)
    cu_q = torch.tensor([0, *torch.tensor(len_q).cumsum(0).tolist()], dtype=torch.int32, device=ctx.device)
    cu_k = torch.tensor([0, *torch.tensor(len_k).cumsum(0).tolist()], dtype=torch.int32, device=ctx.device)
    q = randn(sum(len_q), hq, d, dtype=ctx.dtype, device=ctx.device, scale=_q_scale(ctx), generator=gen)
    table = None
    if block_size:
        capacity = max_k + ctx.draw(st.sampled_from((0, block_size)))
        k, v, table = _paged_cache(ctx, gen, len_k, capacity, block_size, hkv, d, kv_dtype)
    elif ctx.draw(st.booleans()):  # strided views of one packed [total_k, 2, Hkv, D] tensor
        kv = randn(sum(len_k), 2, hkv, d, dtype=kv_dtype, device=ctx.device, generator=gen)
        k, v = kv[:, 0], kv[:, 1]
    else:
        k, v = (randn(sum(len_k), hkv, d, dtype=kv_dtype, device=ctx.device, generator=gen) for _ in range(2))
    window = _window(ctx, causal, max_k)
    scale = ctx.draw(st.sampled_from((None, None, 0.3)))
    kwargs: dict[str, object] = {"softmax_scale": scale, "causal": causal, "window_size": window,
                                 "softcap": softcap, "block_table": table}
    used = None
    if ctx.pick("seqused_k", (False, True)):  # each sequence attends to 0 to all of its keys
        used = [ctx.draw(st.integers(0, n)) for n in len_k]
        kwargs["seqused_k"] = torch.tensor(used, dtype=torch.int32, device=ctx.device)
    kwargs.update(_alibi(ctx, gen, len(len_q), hq), **_descales(ctx, gen, len(len_q), hkv, kv_dtype), **_lse(ctx))
    note = (f"len_q={len_q} len_k={len_k} Hq={hq} Hkv={hkv} D={d} causal={causal} window={window} "
            f"softcap={softcap} block_size={block_size} scale={scale} kv={kv_dtype} seqused_k={used} "
            f"extras={sorted(n for n in kwargs if n in _EXTRAS)}")
    return Case((q, k, v, cu_q, cu_k, max_q, max_k), kwargs, note=note)


_EXTRAS = ("alibi_slopes", "return_softmax_lse", "k_descale", "v_descale", "cache_batch_idx", "cache_leftpad",
           "rotary_cos")


def _cached_lengths(ctx: CaseContext, long: bool, new: int, row: int) -> list[int]:
    """Cached tokens per sequence; on large runs the batch keeps each cache under `_CACHE_ELEMENTS`
    (`row`: elements per cached token)."""
    if not ctx.large:
        longest = ctx.draw(st.sampled_from(_CACHED))
        batch = ctx.draw(st.integers(1, max(1, min(4, _MAX_TOKENS // (longest + new + 1)))))
        return _lengths(ctx, batch, longest)
    longest = ctx.draw(st.sampled_from(_LONG if long else _LARGE_CACHED))
    most = max(1, min(16, _CACHE_ELEMENTS // ((longest + new + 7) * row)))
    if long:
        return _with_long(ctx, longest, ctx.draw(st.integers(0, min(3, most - 1))))[0]
    batch = ctx.draw(st.integers(1, max(1, min(most, 2 * _LARGE_TOKENS // (longest + new + 1)))))
    return _lengths(ctx, batch, longest)


def _rotary(ctx: CaseContext, gen: torch.Generator, d: int, capacity: int) -> dict[str, object]:
    """Rotary tables ``[seqlen_ro >= capacity, rotary_dim / 2]`` of random angles in q's dtype: rotary_dim the
    whole (even part of the) head dim, about half of it, or 16; interleaved or NeoX pairs."""
    half = ctx.draw(st.sampled_from(sorted({d // 2, max(1, d // 4), min(8, d // 2)})))
    angle = torch.rand(capacity + ctx.draw(st.sampled_from((0, 5))), half, generator=gen) * (2 * math.pi)
    return {"rotary_cos": angle.cos().to(device=ctx.device, dtype=ctx.dtype),
            "rotary_sin": angle.sin().to(device=ctx.device, dtype=ctx.dtype),
            "rotary_interleaved": ctx.draw(st.booleans())}


def flash_attn_with_kvcache_case(ctx: CaseContext) -> Case:
    gen = ctx.generator()
    long = _long(ctx)
    d, hq, hkv, causal, softcap, block_size = _flags(ctx)
    append = ctx.pick("append", (False, True))
    sq = ctx.draw(st.sampled_from(_LARGE_SQ) if ctx.large else st.integers(1, 3))
    new = sq if append else 0
    cached = _cached_lengths(ctx, long, new, hkv * d)
    batch, longest = len(cached), max(cached)
    kv_dtype = _kv_dtype(ctx)
    batch_idx = not block_size and ctx.pick("cache_batch_idx", (False, True))
    leftpad = not block_size and ctx.pick("cache_leftpad", (False, True))
    full = not (append or block_size or leftpad) and longest > 0 and ctx.draw(st.integers(0, 4)) == 0
    if full:  # cache_seqlens=None: every cache holds its capacity
        cached = [longest] * batch
    capacity = longest + new + (0 if full else ctx.draw(st.sampled_from((0, 1, 7))))
    ctx.record("max_seqlen_q", sq)
    ctx.record("max_seqlen_k", longest + new)
    q = randn(batch, sq, hq, d, dtype=ctx.dtype, device=ctx.device, scale=_q_scale(ctx), generator=gen)
    kwargs: dict[str, object] = {}
    table = None
    if block_size:
        k_cache, v_cache, table = _paged_cache(ctx, gen, [n + new for n in cached], capacity, block_size, hkv, d,
                                               kv_dtype)
        capacity = table.shape[1] * block_size
    else:
        rows, n_rows = list(range(batch)), batch
        if batch_idx:  # sequence b reads cache row rows[b] of a cache with up to 2 spare rows
            n_rows += ctx.draw(st.integers(0, 2))
            rows = torch.randperm(n_rows, generator=gen)[:batch].tolist()
            kwargs["cache_batch_idx"] = torch.tensor(rows, dtype=torch.int32, device=ctx.device)
        pads = [ctx.draw(st.integers(0, n)) for n in cached] if leftpad else [0] * batch
        if leftpad:
            kwargs["cache_leftpad"] = torch.tensor(pads, dtype=torch.int32, device=ctx.device)
        shape = (n_rows, max(capacity, 1), hkv, d)
        k_cache, v_cache = (torch.full(shape, math.nan) for _ in range(2))  # rows no sequence reads: NaN
        for c in (k_cache, v_cache):
            for b, (r, n) in enumerate(zip(rows, cached)):
                c[r, pads[b]:n + new] = randn(n + new - pads[b], hkv, d, dtype=torch.float32,
                                              device=torch.device("cpu"), generator=gen)
        k_cache, v_cache = (c.to(device=ctx.device, dtype=kv_dtype) for c in (k_cache, v_cache))
    window = _window(ctx, causal, longest + new)
    seqlens: object = torch.tensor(cached, dtype=torch.int32, device=ctx.device)
    if full:
        seqlens = None
    elif len(set(cached)) == 1 and ctx.draw(st.booleans()):
        seqlens = cached[0]  # one int for every sequence
    kwargs.update(cache_seqlens=seqlens, block_table=table, causal=causal, window_size=window, softcap=softcap)
    args: tuple[object, ...] = (q, k_cache, v_cache)
    rotary = False
    if append:
        k, v = (randn(batch, new, hkv, d, dtype=kv_dtype, device=ctx.device, generator=gen) for _ in range(2))
        if ctx.draw(st.booleans()):
            args = (q, k_cache, v_cache, k, v)  # flash-attention's order: k and v positional after the caches
        else:
            kwargs["k"], kwargs["v"] = k, v
        rotary = kv_dtype != FP8 and ctx.pick("rotary", (False, True))
        if rotary:
            kwargs.update(_rotary(ctx, gen, d, capacity))
    kwargs.update(_alibi(ctx, gen, batch, hq), **_descales(ctx, gen, batch, hkv, kv_dtype), **_lse(ctx))
    note = (f"B={batch} Sq={sq} cached={cached} append={append} Hq={hq} Hkv={hkv} D={d} causal={causal} "
            f"window={window} softcap={softcap} block_size={block_size} capacity={capacity} kv={kv_dtype} "
            f"cache_seqlens={'tensor' if isinstance(seqlens, torch.Tensor) else seqlens} "
            f"extras={sorted(n for n in kwargs if n in _EXTRAS)}")
    if not append:
        return Case(args, kwargs, note=note)
    results = 2 if "return_softmax_lse" in kwargs else 1
    exact = (results + 1,) if rotary else (results, results + 1)  # the rotated k is compared by the rule
    return Case(args, kwargs, mutated=(1, 2), exact=exact, note=note)


STRATEGIES = {
    "flash_attn_varlen": flash_attn_varlen_case,
    "flash_attn_with_kvcache": flash_attn_with_kvcache_case,
}

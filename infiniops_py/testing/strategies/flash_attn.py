"""Strategies for FlashAttention, after flash-attention's ``test_flash_attn.py`` (varlen and kvcache tests)
and vLLM's ``test_flash_attn.py``, scaled down for the CPU (at most ~600 query + key tokens per case).

Head dims from flash-attention's sweep; (Sq, Sk) pairs including (1, 147) and (113, 203), Sq > Sk (empty
causal rows) and small ones; 1 to 4 sequences of random lengths, one of them at the maximum; MHA, GQA and
MQA; causal; local windows; softcap {0, 50}; queries now and then scaled x8 (large logits); paged K/V with
block sizes {16, 32, 256}, a shuffled block table whose unused entries are 0 or -1 padding, caches in NHD
or HND (a strided view) layout. The kvcache cases decode 1 to 3 queries per sequence over 0 to 339 cached
tokens, appending new k/v or not. Cache rows past every sequence hold NaN, which must never reach an output.

On `CaseContext.large` (GPU) runs, issue 3's grid: head dims 64, 128 and 256, GQA ratios 1, 4 and 8 and
block sizes 16 and 256 are favored (half the draws), block sizes 64 and 128 join, (Sq, Sk) pairs reach
flash-attention's (512, 256), (1023, 1024) and (2048, 2048) with up to 8 sequences (8192 tokens), up to
32 query heads, and kvcache decodes 1 to 16 queries over up to 4096 cached tokens, batches up to 16. One
case in ten holds one long sequence (2048 to 8192 tokens, the maximum of the issue) beside up to three
short ones; it has at most 8 query heads and k/v caches of at most 2**25 elements, which bounds the
float64 reference (see `reference_varlen`'s blocks of query rows) and the case's memory.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from infiniops_py.testing.case import Case, CaseContext, randn

__all__ = ["STRATEGIES"]

_HEAD_DIMS = (32, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256)
_GQA_RATIOS = (1, 2, 4, 8)
_BLOCK_SIZES = (16, 32, 256)
_VARLEN_SHAPES = ((1, 1), (1, 147), (3, 7), (8, 8), (17, 9), (40, 40), (64, 37), (113, 203), (128, 128))
_CACHED = (0, 5, 20, 128, 147, 339)
_MAX_TOKENS = 600
# large (GPU) runs: issue 3's grid, favored; more and longer sequences; one long sequence in ten cases
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
    if not ctx.pick("local", (False, True)) or max_sk < 2:
        return (-1, -1)
    bound = st.integers(0, max_sk - 1)
    if causal:
        return (ctx.draw(bound), -1)
    left, right = ctx.draw(st.one_of(st.just(-1), bound)), ctx.draw(st.one_of(st.just(-1), bound))
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
                 hkv: int, d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """k/v caches holding `lengths` rows per sequence through a shuffled block table; NaN in unused rows."""
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
        c = randn(*shape, dtype=ctx.dtype, device=ctx.device, generator=gen)
        c = c.transpose(1, 2) if hnd else c  # HND storage seen as an NHD view
        c[(~filled).view(num_blocks, block_size).to(ctx.device)] = float("nan")
        caches.append(c)
    return caches[0], caches[1], table.to(ctx.device)


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
    ctx.record("max_seqlen_q", max_q)
    ctx.record("max_seqlen_k", max_k)
    cu_q = torch.tensor([0, *torch.tensor(len_q).cumsum(0).tolist()], dtype=torch.int32, device=ctx.device)
    cu_k = torch.tensor([0, *torch.tensor(len_k).cumsum(0).tolist()], dtype=torch.int32, device=ctx.device)
    q = randn(sum(len_q), hq, d, dtype=ctx.dtype, device=ctx.device, scale=_q_scale(ctx), generator=gen)
    table = None
    if block_size:
        capacity = max_k + ctx.draw(st.sampled_from((0, block_size)))
        k, v, table = _paged_cache(ctx, gen, len_k, capacity, block_size, hkv, d)
    elif ctx.draw(st.booleans()):  # strided views of one packed [total_k, 2, Hkv, D] tensor
        kv = randn(sum(len_k), 2, hkv, d, dtype=ctx.dtype, device=ctx.device, generator=gen)
        k, v = kv[:, 0], kv[:, 1]
    else:
        k, v = (randn(sum(len_k), hkv, d, dtype=ctx.dtype, device=ctx.device, generator=gen) for _ in range(2))
    window = _window(ctx, causal, max_k)
    scale = ctx.draw(st.sampled_from((None, None, 0.3)))
    kwargs = {"softmax_scale": scale, "causal": causal, "window_size": window, "softcap": softcap,
              "block_table": table}
    note = (f"len_q={len_q} len_k={len_k} Hq={hq} Hkv={hkv} D={d} causal={causal} window={window} "
            f"softcap={softcap} block_size={block_size} scale={scale}")
    return Case((q, k, v, cu_q, cu_k, max_q, max_k), kwargs, note=note)


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


def flash_attn_with_kvcache_case(ctx: CaseContext) -> Case:
    gen = ctx.generator()
    long = _long(ctx)
    d, hq, hkv, causal, softcap, block_size = _flags(ctx)
    append = ctx.pick("append", (False, True))
    sq = ctx.draw(st.sampled_from(_LARGE_SQ) if ctx.large else st.integers(1, 3))
    new = sq if append else 0
    cached = _cached_lengths(ctx, long, new, hkv * d)
    batch, longest = len(cached), max(cached)
    capacity = longest + new + ctx.draw(st.sampled_from((0, 1, 7)))
    ctx.record("max_seqlen_q", sq)
    ctx.record("max_seqlen_k", longest + new)
    seqlens = torch.tensor(cached, dtype=torch.int32, device=ctx.device)
    q = randn(batch, sq, hq, d, dtype=ctx.dtype, device=ctx.device, scale=_q_scale(ctx), generator=gen)
    table = None
    if block_size:
        k_cache, v_cache, table = _paged_cache(ctx, gen, [n + new for n in cached], capacity, block_size, hkv, d)
    else:
        k_cache, v_cache = (randn(batch, max(capacity, 1), hkv, d, dtype=torch.float32, device=torch.device("cpu"),
                                  generator=gen) for _ in range(2))
        for c in (k_cache, v_cache):
            for b, n in enumerate(cached):
                c[b, n + new:] = float("nan")
        k_cache, v_cache = (c.to(device=ctx.device, dtype=ctx.dtype) for c in (k_cache, v_cache))
    window = _window(ctx, causal, longest + new)
    kwargs = {"cache_seqlens": seqlens, "block_table": table, "causal": causal, "window_size": window,
              "softcap": softcap}
    if append:
        kwargs["k"], kwargs["v"] = (randn(batch, new, hkv, d, dtype=ctx.dtype, device=ctx.device, generator=gen)
                                    for _ in range(2))
    note = (f"B={batch} Sq={sq} cached={cached} append={append} Hq={hq} Hkv={hkv} D={d} causal={causal} "
            f"window={window} softcap={softcap} block_size={block_size} capacity={capacity}")
    if append:
        return Case((q, k_cache, v_cache), kwargs, mutated=(1, 2), exact=(1, 2), note=note)
    return Case((q, k_cache, v_cache), kwargs, note=note)


STRATEGIES = {
    "flash_attn_varlen": flash_attn_varlen_case,
    "flash_attn_with_kvcache": flash_attn_with_kvcache_case,
}

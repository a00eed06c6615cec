"""Triton kernels of ``flash_attn_with_kvcache``: append the new k/v, split-K attention, combine the splits.

Decode reads the whole KV cache for a handful of queries, so it is bound by memory bandwidth. One program
handles one (sequence, kv head, key split) and *all* the query rows of that kv head at once (the
``Hq // Hkv`` GQA heads times the ``Sq`` queries, packed as rows of one tile), so every K/V byte is read
once. Long contexts are split over ``num_splits`` programs to fill the GPU; each writes its normalized
partial output and its log-sum-exp (base 2), and `combine_kernel` merges them (and writes the natural
log-sum-exp of the row when asked). ``HAS_BATCH_IDX`` reads (and appends to) cache row ``cache_batch_idx[b]``
of sequence b; a row out of range is a sequence that sees no key and writes nothing.

With ``FUSED`` the split count adapts to each sequence's length on the device and the combine happens in
the same kernel: the host cannot know the lengths (it would have to synchronize), so it launches
``num_splits`` programs per tile for the longest context the cache holds, and each tile uses
``min(num_splits, key blocks / MIN_SPLIT_BLOCKS)`` of them (the others exit). A tile of one split writes its
output directly; otherwise each split writes its partial, counts itself done on the tile's counter (an
atomic add after a barrier, acquire-release at GPU scope), and the split that finds it is the last one
resets the counter and merges the partials (read past L1). So a decode step is one kernel at any context
length, and a short context is one program per tile (FlashDecoding's split-KV where it pays, FlashDecoding++'s
single pass where it does not). The counters (int32, one per tile) start and end at 0; two kernels using
the same counters at once (two streams) would race, so the launcher keeps them per device and stream.

With ``APPEND`` (a paged cache, no ``cache_batch_idx``) the decode kernel also does the append: keys at
positions ``>= cache_seqlens[b]`` are read from the new k/v instead of the cache, and the first program of
each (sequence, kv head) writes them into the cache, so a decode step's cache write costs no launch. With
``NEW_FIRST`` the new keys and that write come before the cache loop (their loads and stores then overlap the
cache's), else after it.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from infiniops_triton._common import pdl_start
from infiniops_triton._flash_attn_kernels import (
    LN2,
    NEG_BIG,
    SMEM_BUDGET,
    kv_offsets,
    natural_lse,
    scores,
    softcapped,
    weighted_values,
)

__all__ = ["append_kv_kernel", "combine_kernel", "decode_split_kernel", "decode_split_tuned"]

# Integer arguments that only carry sizes are not specialized (see _flash_attn_kernels._SIZES): a decode
# workload changes them every step, and each "divisible by 16" / "equal to 1" change would be a compile.
_APPEND_SIZES = ("stride_btb", "new_len", "num_heads_kv", "capacity", "max_blocks", "num_pages", "num_rows")
_DECODE_SIZES = ("stride_btb", "stride_lse_b", "stride_lse_h", "num_heads_kv", "num_heads_q", "q_len", "kv_group",
                 "new_len", "capacity", "max_blocks", "num_pages", "num_rows", "num_m_tiles", "num_splits",
                 "window_left", "window_right", "min_split_blocks", "tune_size")
_COMBINE_SIZES = ("stride_lse_b", "stride_lse_h", "q_len", "num_heads_q", "num_splits")


@triton.jit(do_not_specialize=_APPEND_SIZES)
def append_kv_kernel(
    KNew, VNew,  # [B, Sq_new, Hkv, D] new keys / values (any strides but the last)
    KCache, VCache,  # [B, S_max, Hkv, D] or paged [num_pages, PAGE_SIZE, Hkv, D], written in place
    CacheSeqlens,  # int32 [B] tokens already cached: new token t of sequence b goes to position len_b + t
    BlockTable,  # int32 [B, max_blocks] (PAGED only)
    CacheBatchIdx,  # int32 [B] cache row of each sequence (HAS_BATCH_IDX only; not PAGED)
    stride_nb, stride_nt, stride_nh, stride_vnb, stride_vnt, stride_vnh,
    stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_btb,
    new_len, num_heads_kv, capacity, max_blocks, num_pages, num_rows,
    HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, HAS_BATCH_IDX: tl.constexpr,
):
    """One program per new token: copies its Hkv x D keys and values; a position outside the cache (or in a
    cache row out of range) is skipped."""
    pid = tl.program_id(0)
    b = pid // new_len
    t = pid % new_len
    pos = tl.load(CacheSeqlens + b) + t
    ok = (pos >= 0) & (pos < capacity)
    pos = tl.where(ok, pos, 0)
    row = b
    if HAS_BATCH_IDX:
        row = tl.load(CacheBatchIdx + b)
        ok = ok & (row >= 0) & (row < num_rows)
        row = tl.where(ok, row, 0)
    if PAGED:
        page = tl.load(BlockTable + b.to(tl.int64) * stride_btb + pos // PAGE_SIZE, mask=ok, other=-1)
        ok = ok & (page >= 0) & (page < num_pages)
        page = tl.where(ok, page, 0).to(tl.int64)
        k_row = page * stride_kb + (pos % PAGE_SIZE) * stride_kt
        v_row = page * stride_vb + (pos % PAGE_SIZE) * stride_vt
    else:
        k_row = row.to(tl.int64) * stride_kb + pos.to(tl.int64) * stride_kt
        v_row = row.to(tl.int64) * stride_vb + pos.to(tl.int64) * stride_vt
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < num_heads_kv) & (offs_d[None, :] < HEAD_DIM)
    src_k = b.to(tl.int64) * stride_nb + t * stride_nt + offs_h[:, None] * stride_nh + offs_d[None, :]
    src_v = b.to(tl.int64) * stride_vnb + t * stride_vnt + offs_h[:, None] * stride_vnh + offs_d[None, :]
    k = tl.load(KNew + src_k, mask=mask)
    v = tl.load(VNew + src_v, mask=mask)
    tl.store(KCache + k_row + offs_h[:, None] * stride_kh + offs_d[None, :], k, mask=mask & ok)
    tl.store(VCache + v_row + offs_h[:, None] * stride_vh + offs_d[None, :], v, mask=mask & ok)


@triton.jit(do_not_specialize=_DECODE_SIZES)
def decode_split_kernel(
    Q,  # [B, Sq, Hq, D] queries (last stride 1)
    KCache, VCache,  # [B, S_max, Hkv, D] or paged [num_pages, PAGE_SIZE, Hkv, D]
    CacheSeqlens,  # int32 [B]: sequence b attends to cache_seqlens[b] + new_len keys
    BlockTable,  # int32 [B, max_blocks] (PAGED only)
    CacheBatchIdx,  # int32 [B] cache row of each sequence (HAS_BATCH_IDX only; not PAGED)
    Out,  # [B, Sq, Hq, D] output (not SPLIT)
    OPart,  # fp32 [B, Sq, Hq, num_splits, D] normalized partial outputs (SPLIT)
    LsePart,  # fp32 [B, Sq, Hq, num_splits] partial log2-sum-exp2, -inf for a split that saw no key (SPLIT)
    Lse,  # fp32 [B, Hq, Sq] natural log-sum-exp of each row (HAS_LSE; with SPLIT and not FUSED the combine writes it)
    Counter,  # int32 [programs] splits done per tile, 0 between kernels (FUSED only)
    KNew, VNew,  # [B, new_len, Hkv, D] new keys / values (APPEND only)
    stride_nb, stride_nt, stride_nh, stride_vnb, stride_vnt, stride_vnh,
    stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_ob, stride_ot, stride_oh, stride_btb, stride_lse_b, stride_lse_h,
    num_heads_kv, num_heads_q, q_len, kv_group, new_len, capacity, max_blocks, num_pages, num_rows, num_m_tiles,
    num_splits, qk_scale, softcap_scale, window_left, window_right,  # as in attn_fwd_kernel
    min_split_blocks,  # FUSED: key blocks a split takes at least
    tune_size,  # autotuning key only: the size class of the launch (programs) and the launched splits
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, PRECISION: tl.constexpr, HAS_BATCH_IDX: tl.constexpr,
    HAS_LSE: tl.constexpr, FUSED: tl.constexpr, APPEND: tl.constexpr, PDL: tl.constexpr,
    NEW_FIRST: tl.constexpr = False,  # APPEND: the new keys and the cache write before the cache loop
):
    pdl_start(PDL)
    pid = tl.program_id(0)
    split = tl.program_id(1)
    tile = pid % num_m_tiles
    bh = pid // num_m_tiles
    b = bh // num_heads_kv
    h_kv = bh % num_heads_kv

    cached = tl.load(CacheSeqlens + b)  # keys at positions >= cached are the new ones (APPEND: read from KNew)
    kv_len = tl.minimum(tl.maximum(cached + new_len, 0), capacity)
    row = b  # the cache row of sequence b (contiguous caches)
    if HAS_BATCH_IDX:
        row = tl.load(CacheBatchIdx + b)
        present = (row >= 0) & (row < num_rows)
        kv_len = tl.where(present, kv_len, 0)  # a cache row out of range: the sequence sees no key
        row = tl.where(present, row, 0)
    q_off = kv_len - q_len

    # Row r of the tile is query i = r % Sq of GQA head g = r // Sq of this kv head.
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < kv_group * q_len
    g = rows // q_len
    i = rows % q_len
    h = h_kv * kv_group + g
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < HEAD_DIM
    q_ptrs = Q + b.to(tl.int64) * stride_qb + i[:, None] * stride_qt + h[:, None] * stride_qh + offs_d[None, :]

    # The tile's key range, then this split's even share of its key blocks.
    hi = kv_len
    if HAS_RIGHT:
        i_last = tl.max(tl.where(row_ok, i, 0), 0)
        hi = tl.minimum(hi, tl.maximum(i_last + q_off + window_right + 1, 0))
    lo = 0
    if HAS_LEFT:
        i_first = tl.min(tl.where(row_ok, i, q_len), 0)
        lo = tl.maximum(i_first + q_off - window_left, 0) // BLOCK_N * BLOCK_N
    blocks = tl.cdiv(tl.maximum(hi - lo, 0), BLOCK_N)
    splits = num_splits
    if FUSED:  # this tile's share of the launched splits: at least min_split_blocks key blocks each
        splits = tl.minimum(num_splits, tl.maximum(tl.cdiv(blocks, min_split_blocks), 1))
    per_split = tl.cdiv(blocks, splits) * BLOCK_N
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok & (split < splits), other=0.0)  # an idle split reads nothing
    start = lo + split * per_split
    end = tl.minimum(hi, start + per_split)

    K = KCache + h_kv.to(tl.int64) * stride_kh
    V = VCache + h_kv.to(tl.int64) * stride_vh
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + NEG_BIG
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    diag = i[:, None] + q_off
    cached_end = tl.minimum(end, cached) if APPEND else end  # APPEND: the cache holds the keys before `cached`
    for phase in tl.static_range(2):  # the cache loop and APPEND's new keys (first with NEW_FIRST, else last)
        if phase == (1 - NEW_FIRST):  # constexprs: the order is fixed at compile time
            if APPEND:  # the new keys (a decode step: one) from KNew/VNew, and the cache write
                m_i, l_i, acc = _new_keys(q, KNew, VNew, K, V, BlockTable, b, h_kv, tile, split, start, end, cached,
                                          new_len, capacity, max_blocks, num_pages, diag, m_i, l_i, acc, offs_d,
                                          d_ok, stride_nb, stride_nt, stride_nh, stride_vnb, stride_vnt, stride_vnh,
                                          stride_kb, stride_kt, stride_vb, stride_vt, stride_btb, qk_scale,
                                          softcap_scale, window_left, window_right, HEAD_DIM, BLOCK_N, HAS_LEFT,
                                          HAS_RIGHT, SOFTCAP, PAGE_SIZE, PRECISION)
        else:
            for start_n in range(start, cached_end, BLOCK_N):
                offs_n = start_n + tl.arange(0, BLOCK_N)
                k_off, v_off, valid = kv_offsets(BlockTable, b, offs_n, 0, cached_end, stride_btb, max_blocks,
                                                 num_pages, stride_kb, stride_kt, stride_vb, stride_vt, PAGED,
                                                 PAGE_SIZE)
                if not PAGED:
                    k_off += row.to(tl.int64) * stride_kb
                    v_off += row.to(tl.int64) * stride_vb
                k = tl.load(K + k_off[:, None] + offs_d[None, :], mask=valid[:, None] & d_ok, other=0.0)
                v = tl.load(V + v_off[:, None] + offs_d[None, :], mask=valid[:, None] & d_ok, other=0.0)
                m_i, l_i, acc = _online_block(q, k, v, offs_n, valid, diag, m_i, l_i, acc, qk_scale, softcap_scale,
                                              window_left, window_right, HAS_LEFT, HAS_RIGHT, SOFTCAP, PRECISION)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    mask = row_ok[:, None] & d_ok
    o_ptrs = Out + b.to(tl.int64) * stride_ob + i[:, None] * stride_ot + h[:, None] * stride_oh + offs_d[None, :]
    lse_ptrs = Lse + b.to(tl.int64) * stride_lse_b + h * stride_lse_h + i
    if not SPLIT:
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=mask)
        if HAS_LSE:
            tl.store(lse_ptrs, natural_lse(m_i, l_i), mask=row_ok)
    elif FUSED and splits == 1:  # a short context: the first split is the only one, no partials
        if split == 0:
            tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=mask)
            if HAS_LSE:
                tl.store(lse_ptrs, natural_lse(m_i, l_i), mask=row_ok)
    elif split < splits:
        first = ((b.to(tl.int64) * q_len + i) * num_heads_q + h) * num_splits
        tl.store(OPart + (first + split)[:, None] * HEAD_DIM + offs_d[None, :], out, mask=mask)
        lse = tl.where(l_i > 0.0, m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
        tl.store(LsePart + first + split, lse, mask=row_ok)
        if FUSED:
            tl.debug_barrier()  # every thread's partial is stored before the count says so
            done = tl.atomic_add(Counter + pid, 1, sem="acq_rel")
            if done == splits - 1:  # the last split of the tile merges them all
                tl.atomic_xchg(Counter + pid, 0)
                merged, merged_lse = _merge_splits(OPart, LsePart, first, splits, mask, row_ok, offs_d, HEAD_DIM,
                                                   BLOCK_M, BLOCK_D)
                tl.store(o_ptrs, merged.to(Out.dtype.element_ty), mask=mask)
                if HAS_LSE:
                    tl.store(lse_ptrs, merged_lse, mask=row_ok)


@triton.jit
def _online_block(q, k, v, offs_n, valid, diag, m_i, l_i, acc, qk_scale, softcap_scale, window_left, window_right,
                  HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, PRECISION: tl.constexpr):
    """One key block of the online softmax: scores (softcapped, window-masked, missing keys dropped), then the
    running max `m_i`, sum `l_i` and weighted values `acc` updated (base-2 exponentials)."""
    s = softcapped(scores(q, k, PRECISION), qk_scale, softcap_scale, SOFTCAP)
    keep = valid[None, :]
    if HAS_RIGHT:
        keep = keep & (offs_n[None, :] <= diag + window_right)
    if HAS_LEFT:
        keep = keep & (offs_n[None, :] >= diag - window_left)
    s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = weighted_values(p, v, acc * alpha[:, None], PRECISION)
    return m_new, l_i, acc


@triton.jit
def _new_keys(q, KNew, VNew, K, V, BlockTable, b, h_kv, tile, split, start, end, cached, new_len, capacity,
              max_blocks, num_pages, diag, m_i, l_i, acc, offs_d, d_ok, stride_nb, stride_nt, stride_nh, stride_vnb,
              stride_vnt, stride_vnh, stride_kb, stride_kt, stride_vb, stride_vt, stride_btb, qk_scale,
              softcap_scale, window_left, window_right, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, PAGE_SIZE: tl.constexpr,
              PRECISION: tl.constexpr):
    """APPEND: this split's keys at positions ``>= cached`` (a decode step: one), read from KNew/VNew into the
    online softmax; then the first program of each (sequence, kv head) writes the new k/v into the paged cache
    (K/V: the head's base pointers there)."""
    for start_n in range(tl.maximum(start, cached), end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        _, _, valid = kv_offsets(BlockTable, b, offs_n, 0, end, stride_btb, max_blocks, num_pages, stride_kb,
                                 stride_kt, stride_vb, stride_vt, True, PAGE_SIZE)  # keys on pages in range
        t = tl.where(valid, offs_n - cached, 0).to(tl.int64)
        ok = valid[:, None] & d_ok
        k = tl.load(KNew + b.to(tl.int64) * stride_nb + t[:, None] * stride_nt + h_kv * stride_nh
                    + offs_d[None, :], mask=ok, other=0.0)
        v = tl.load(VNew + b.to(tl.int64) * stride_vnb + t[:, None] * stride_vnt + h_kv * stride_vnh
                    + offs_d[None, :], mask=ok, other=0.0)
        m_i, l_i, acc = _online_block(q, k, v, offs_n, valid, diag, m_i, l_i, acc, qk_scale, softcap_scale,
                                      window_left, window_right, HAS_LEFT, HAS_RIGHT, SOFTCAP, PRECISION)
    if (tile == 0) & (split == 0):
        _write_new_kv(KNew, VNew, K, V, BlockTable, b, h_kv, cached, new_len, capacity, max_blocks, num_pages,
                      stride_nb, stride_nt, stride_nh, stride_vnb, stride_vnt, stride_vnh, stride_kb, stride_kt,
                      stride_vb, stride_vt, stride_btb, offs_d, HEAD_DIM, PAGE_SIZE)
    return m_i, l_i, acc


@triton.jit
def _write_new_kv(KNew, VNew, K, V, BlockTable, b, h_kv, cached, new_len, capacity, max_blocks, num_pages,
                  stride_nb, stride_nt, stride_nh, stride_vnb, stride_vnt, stride_vnh, stride_kb, stride_kt,
                  stride_vb, stride_vt, stride_btb, offs_d, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """`append_kv_kernel`'s write of kv head `h_kv`'s new tokens of sequence `b` (K/V: the head's base pointers
    in the paged caches): position ``cached + t``, skipped outside the cache or on a page out of range."""
    d_ok = offs_d < HEAD_DIM
    for t in range(0, new_len):
        pos = cached + t
        ok = (pos >= 0) & (pos < capacity)
        page = tl.load(BlockTable + b.to(tl.int64) * stride_btb + pos // PAGE_SIZE,
                       mask=ok & (pos // PAGE_SIZE < max_blocks), other=-1)
        ok = ok & (page >= 0) & (page < num_pages)
        page = tl.where(ok, page, 0).to(tl.int64)
        slot = tl.where(ok, pos % PAGE_SIZE, 0).to(tl.int64)
        k = tl.load(KNew + b.to(tl.int64) * stride_nb + t * stride_nt + h_kv * stride_nh + offs_d, mask=d_ok)
        v = tl.load(VNew + b.to(tl.int64) * stride_vnb + t * stride_vnt + h_kv * stride_vnh + offs_d, mask=d_ok)
        tl.store(K + page * stride_kb + slot * stride_kt + offs_d, k, mask=d_ok & ok)
        tl.store(V + page * stride_vb + slot * stride_vt + offs_d, v, mask=d_ok & ok)


@triton.jit
def _merge_splits(OPart, LsePart, first, splits, mask, row_ok, offs_d, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    """The merged output (fp32) and natural log-sum-exp of a tile's rows from their `splits` partials (the
    combine kernel's sum, online over the splits), read past L1: other programs wrote them."""
    top = tl.zeros([BLOCK_M], dtype=tl.float32) + float("-inf")
    total = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for s in range(0, splits):
        lse = tl.load(LsePart + first + s, mask=row_ok, other=float("-inf"), cache_modifier=".cg")
        o = tl.load(OPart + (first + s)[:, None] * HEAD_DIM + offs_d[None, :], mask=mask, other=0.0,
                    cache_modifier=".cg")
        new_top = tl.maximum(top, lse)
        safe = tl.where(new_top == float("-inf"), 0.0, new_top)
        rescale = tl.exp2(top - safe)
        w = tl.exp2(lse - safe)
        acc = acc * rescale[:, None] + w[:, None] * o
        total = total * rescale + w
        top = new_top
    out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
    lse_row = tl.where(total > 0.0, (top + tl.log2(tl.where(total > 0.0, total, 1.0))) * LN2, float("inf"))
    return out, lse_row


@triton.jit(do_not_specialize=_COMBINE_SIZES)
def combine_kernel(
    OPart,  # fp32 [B, Sq, Hq, num_splits, D] normalized partial outputs
    LsePart,  # fp32 [B, Sq, Hq, num_splits] their log2-sum-exp2 (-inf: the split saw no key)
    Out,  # [B, Sq, Hq, D] output
    Lse,  # fp32 [B, Hq, Sq] natural log-sum-exp of each row (HAS_LSE only)
    stride_ob, stride_ot, stride_oh, stride_lse_b, stride_lse_h, q_len, num_heads_q, num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, HAS_LSE: tl.constexpr,
):
    """One program per output row (b, i, h): ``out = sum_s w_s o_s / sum_s w_s``, ``w_s = exp2(lse_s - max)``;
    the row's log-sum-exp is ``(max + log2(sum_s w_s)) * ln 2`` (+inf when no split saw a key)."""
    row = tl.program_id(0).to(tl.int64)
    h = row % num_heads_q
    i = (row // num_heads_q) % q_len
    b = row // (num_heads_q * q_len)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < num_splits
    lse = tl.load(LsePart + row * num_splits + offs_s, mask=s_ok, other=float("-inf"))
    top = tl.max(lse, 0)
    top = tl.where(top == float("-inf"), 0.0, top)
    w = tl.exp2(lse - top)
    o = tl.load(OPart + (row * num_splits + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
                mask=s_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    total = tl.sum(w, 0)
    out = tl.sum(w[:, None] * o, 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(Out + b * stride_ob + i * stride_ot + h * stride_oh + offs_d, out.to(Out.dtype.element_ty),
             mask=offs_d < HEAD_DIM)
    if HAS_LSE:
        lse_row = tl.where(total > 0.0, (top + tl.log2(tl.where(total > 0.0, total, 1.0))) * LN2, float("inf"))
        tl.store(Lse + b * stride_lse_b + h * stride_lse_h + i, lse_row)


# --- autotuning (CUDA; the interpreter runs one fixed configuration) --------------------------------


def _decode_configs() -> list[triton.Config]:
    # (BLOCK_N, num_warps, num_stages). Paged K/V rows are gathered through the block table, a load the
    # pipeliner schedules before them: K/V get num_stages - 3 buffers there, hence the deep pipelines; the
    # shallow ones leave shared memory for several programs per SM (short contexts: many small programs).
    # The fifth configuration fits every head dim and dtype.
    shapes = [(64, 4, 5), (128, 4, 4), (64, 4, 3), (64, 4, 2), (32, 4, 2), (128, 8, 3), (32, 4, 3)]
    return [triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=s) for bn, w, s in shapes]


def _prune_decode(configs: list[triton.Config], named_args: dict[str, Any], **kwargs: Any) -> list[triton.Config]:
    """Drop what may not fit in shared memory; fp16/bf16 time those left, fp32 takes the first."""
    elem = named_args["Q"].element_size()
    block_d = kwargs["BLOCK_D"]
    fits = [c for c in configs if c.num_stages * 2 * c.kwargs["BLOCK_N"] * block_d * elem <= SMEM_BUDGET]
    fits = fits or configs[4:5]
    return fits if elem == 2 else fits[:1]


decode_split_tuned = triton.autotune(
    _decode_configs(), key=["HEAD_DIM", "BLOCK_M", "PAGED", "SPLIT", "HAS_BATCH_IDX", "HAS_LSE", "FUSED", "APPEND",
                          "tune_size"],
    prune_configs_by={"early_config_prune": _prune_decode},
)(decode_split_kernel)

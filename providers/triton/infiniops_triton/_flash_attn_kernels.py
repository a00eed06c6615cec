"""Triton kernels of the varlen FlashAttention forward (prefill), and the pieces the decode kernels share.

One program computes ``BLOCK_M`` query rows of one (sequence, query head) with the online softmax of
FlashAttention-2, in base 2: the launcher folds ``log2(e)`` into the score scale so the kernel calls
``exp2``. The key range of a program is split in three loops: the keys below the sliding window's fully
visible part (masked), the fully visible keys (no mask arithmetic at all) and the diagonal / window edge /
sequence end (masked). The rescale of the accumulator is lazy (FlashAttention-4's trick): it happens only
when some row's running max grows by more than ``_RESCALE_LOG2`` (a factor 256), which fp32 accumulators
absorb without loss; the final division by the row sum makes the result exact either way.

The epilogue writes each row's log-sum-exp when asked (``HAS_LSE``: ``(m + log2(l)) * ln 2``, +inf for a
row that saw no key); ``HAS_SEQUSED`` takes each sequence's key count from ``seqused_k`` (clamped to its
``cu_seqlens_k`` rows, or to the block table's capacity when paged).

A sequence's rows are clamped into the tensors first: its query rows into ``[0, total_q)``, its key rows
into ``[0, total_k)`` (contiguous K/V) and its key count into the block table's capacity (paged), so that
``cu_seqlens`` that do not cut the rows (unchecked metadata) give unspecified numbers, never an access out
of bounds.

Programs run longest first: within each group of ``GROUP`` (sequence, head) pairs, the program id walks
the query blocks from the last (the most keys under a causal mask) to the first, and the heads of a group
run side by side so their keys stay in L2.

Triton 3.6's warp specialization (``tl.range(..., warp_specialize=True)``, FlashAttention-3's producer and
consumer warpgroups) was tried for this loop and dropped: compiled for sm_90 it wrote NaNs on the H200 where the
interpreter's results were right, and it was not faster (benchmarks/RESULTS.md, session 9, run B).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import triton
import triton.language as tl

__all__ = ["LN2", "LOG2E", "SMEM_BUDGET", "attn_fwd_kernel", "attn_fwd_tuned", "kv_offsets", "natural_lse", "scores",
           "softcapped", "tanh", "tma_layout_ok", "weighted_values"]

LOG2E = 1.4426950408889634  # log2(e): exp(x) == exp2(x * LOG2E)
LN2 = tl.constexpr(0.6931471805599453)  # ln(2): a log-sum-exp in log2 units times LN2 is the natural one
SMEM_BUDGET = 200 * 1024  # bytes of shared memory a configuration may plan for (H100/H200: 227 KB)
# Integer arguments that only carry sizes: Triton would otherwise compile a new variant for every change of
# "divisible by 16" or "equal to 1" among them (hundreds of compiles over a varlen workload); strides stay
# specialized, since their alignment decides vectorized loads.
_SIZES = ("stride_btb", "stride_lse_h", "num_bh", "num_heads_q", "kv_group", "max_seqlen_q", "max_blocks",
          "num_pages", "total_q", "total_k", "window_left", "window_right")

# Skip the accumulator rescale until some row's max grew by more than 2**8 (log2 units); fp32 holds it.
_RESCALE_LOG2 = tl.constexpr(8.0)
# A finite "minus infinity" for the running max: a row that has seen only masked keys keeps it, and
# exp2(-inf - _NEG_BIG) == 0 instead of the NaN that exp2(-inf - (-inf)) would give.
NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def natural_lse(m_i, l_i):
    """The log-sum-exp of a row from its online-softmax state in log2 units (``sum_j exp2(s_j - m_i) = l_i``),
    +inf for a row that saw no key (flash-attention 2's value there)."""
    return tl.where(l_i > 0.0, (m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0))) * LN2, float("inf"))


@triton.jit
def tanh(x):
    """tanh through exp2, no libdevice needed; |x| is clamped at 20, where tanh is 1 in fp32."""
    x = tl.minimum(tl.maximum(x, -20.0), 20.0)
    return 1.0 - 2.0 / (tl.exp2(x * (2.0 * 1.4426950408889634)) + 1.0)


@triton.jit
def softcapped(qk, qk_scale, softcap_scale, SOFTCAP: tl.constexpr):
    """Scores in log2 units: ``qk * scale * log2e``, or ``softcap * tanh(qk * scale / softcap) * log2e``.

    With SOFTCAP the launcher passes ``qk_scale = softcap * log2e`` and ``softcap_scale = scale / softcap``.
    """
    if SOFTCAP:
        return tanh(qk * softcap_scale) * qk_scale
    else:
        return qk * qk_scale


@triton.jit
def scores(q, k, PRECISION: tl.constexpr):
    """``q @ k^T`` in fp32. ``PRECISION == "fp64"`` (float32 inputs): products and sums in float64, rounded
    once. A sequential fp32 dot over 256 columns errs by ~1e-4 on |q.k| ~ 500 (large logits): relative
    weight errors of ~3e-5 that fail the 3x-the-fp32-reference rule; float64 leaves only the final rounding."""
    if PRECISION == "fp64":
        return tl.dot(q.to(tl.float64), tl.trans(k).to(tl.float64)).to(tl.float32)
    else:
        return tl.dot(q, tl.trans(k), input_precision=PRECISION)


@triton.jit
def weighted_values(p, v, acc, PRECISION: tl.constexpr):
    """``acc + p @ v`` with fp32 accumulation (IEEE fp32 products when `PRECISION` is ``"fp64"``: weights <= 1
    over one key block need no more)."""
    if PRECISION == "fp64":
        return tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")
    else:
        return tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)


@triton.jit
def kv_offsets(
    BlockTable,  # int32 [B, max_blocks]: the pages of sequence b (read when PAGED)
    b, n, kv_start, kv_len, stride_btb, max_blocks, num_pages,
    stride_kb, stride_kt, stride_vb, stride_vt,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
):
    """Element offsets (int64) of the K and V rows of keys `n` of sequence `b`, and which keys exist.

    Contiguous: key n is row ``kv_start + n``. Paged: key n lives in page ``block_table[b, n // PAGE_SIZE]``
    at slot ``n % PAGE_SIZE``; a page index outside ``[0, num_pages)`` (possible only with unchecked
    indices) marks its keys missing, so they are never read and never attended to.
    """
    inside = (n >= 0) & (n < kv_len)
    if PAGED:
        col = n // PAGE_SIZE
        page = tl.load(BlockTable + b.to(tl.int64) * stride_btb + col, mask=inside & (col < max_blocks), other=-1)
        valid = inside & (page >= 0) & (page < num_pages)
        page = tl.where(valid, page, 0).to(tl.int64)
        slot = (n % PAGE_SIZE).to(tl.int64)
        return page * stride_kb + slot * stride_kt, page * stride_vb + slot * stride_vt, valid
    else:
        row = kv_start + n.to(tl.int64)
        return row * stride_kt, row * stride_vt, inside


@triton.jit
def _attn_block(
    acc, l_i, m_i, q, K, V, BlockTable,  # K/V: the kv head's base pointers
    start_n, offs_m, offs_d, b, kv_start, kv_len, q_off,
    stride_btb, max_blocks, num_pages, stride_kb, stride_kt, stride_vb, stride_vt,
    qk_scale, softcap_scale, window_left, window_right,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
    EVEN_D: tl.constexpr, LAZY: tl.constexpr, PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
):
    """One key block of the online softmax; MASKED=False is the fully visible fast path."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if USE_TMA:  # K/V are the sequence's tensor descriptors: rows past kv_len, columns past HEAD_DIM read 0
        k = K.load([start_n, 0])
        v = V.load([start_n, 0])
        valid = offs_n < kv_len
    else:
        k_off, v_off, valid = kv_offsets(BlockTable, b, offs_n, kv_start, kv_len, stride_btb, max_blocks,
                                         num_pages, stride_kb, stride_kt, stride_vb, stride_vt, PAGED, PAGE_SIZE)
        if MASKED or PAGED or not EVEN_D:
            kv_mask = valid[:, None] & (offs_d[None, :] < HEAD_DIM)
            k = tl.load(K + k_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(V + v_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        else:
            k = tl.load(K + k_off[:, None] + offs_d[None, :])
            v = tl.load(V + v_off[:, None] + offs_d[None, :])
    qk = scores(q, k, PRECISION)
    if MASKED or PAGED or SOFTCAP:
        s = softcapped(qk, qk_scale, softcap_scale, SOFTCAP)
        if MASKED and not PAGED:  # the sequence end folded into the right edge: one compare per score
            diag = offs_m[:, None] + q_off  # query i aligned bottom-right: key i + Sk - Sq is its diagonal
            if HAS_RIGHT:
                keep = offs_n[None, :] <= tl.minimum(diag + window_right, kv_len - 1)
            else:
                keep = offs_n[None, :] < kv_len
            if HAS_LEFT:
                keep = keep & (offs_n[None, :] >= diag - window_left)
            s = tl.where(keep, s, float("-inf"))
        elif MASKED or PAGED:  # paged: `valid` also says which pages exist
            keep = valid[None, :]
            if MASKED:
                diag = offs_m[:, None] + q_off
                if HAS_RIGHT:
                    keep = keep & (offs_n[None, :] <= diag + window_right)
                if HAS_LEFT:
                    keep = keep & (offs_n[None, :] >= diag - window_left)
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # qk_scale >= 0: max commutes with the scale
    if LAZY:
        if tl.max(m_new - m_i, 0) > _RESCALE_LOG2:
            alpha = tl.exp2(m_i - m_new)
            acc = acc * alpha[:, None]
            l_i = l_i * alpha
            m_i = m_new
    else:
        alpha = tl.exp2(m_i - m_new)
        m_i = m_new
    if MASKED or PAGED or SOFTCAP:  # noqa: SIM108 (a constexpr branch: `s` exists only here)
        p = tl.exp2(s - m_i[:, None])
    else:
        p = tl.exp2(qk * qk_scale - m_i[:, None])  # one FMA per score
    if LAZY:
        l_i += tl.sum(p, 1)
    else:
        acc = acc * alpha[:, None]
    acc = weighted_values(p, v, acc, PRECISION)
    if not LAZY:  # the running sum last: fewer registers live across the dots
        l_i = l_i * alpha + tl.sum(p, 1)
    return acc, l_i, m_i


@triton.jit
def _attn_loop(
    acc, l_i, m_i, q, K, V, BlockTable, lo, hi,
    offs_m, offs_d, b, kv_start, kv_len, q_off,
    stride_btb, max_blocks, num_pages, stride_kb, stride_kt, stride_vb, stride_vt,
    qk_scale, softcap_scale, window_left, window_right,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
    EVEN_D: tl.constexpr, LAZY: tl.constexpr, PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
):
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        acc, l_i, m_i = _attn_block(
            acc, l_i, m_i, q, K, V, BlockTable, start_n, offs_m, offs_d, b, kv_start, kv_len, q_off,
            stride_btb, max_blocks, num_pages, stride_kb, stride_kt, stride_vb, stride_vt,
            qk_scale, softcap_scale, window_left, window_right,
            HEAD_DIM, BLOCK_N, MASKED, HAS_LEFT, HAS_RIGHT, SOFTCAP, PAGED, PAGE_SIZE, EVEN_D, LAZY, PRECISION,
            USE_TMA,
        )
    return acc, l_i, m_i


@triton.jit(do_not_specialize=_SIZES)
def attn_fwd_kernel(
    Q,  # [total_q, Hq, D] queries (last stride 1)
    K,  # [total_k, Hkv, D] keys, or paged [num_pages, PAGE_SIZE, Hkv, D]
    V,  # like K
    Out,  # [total_q, Hq, D] output
    CuQ,  # int32 [B + 1] cumulative query lengths
    CuK,  # int32 [B + 1] cumulative key lengths (lengths only, when PAGED)
    BlockTable,  # int32 [B, max_blocks] pages of each sequence (PAGED only)
    SeqUsedK,  # int32 [B] keys each sequence uses (HAS_SEQUSED only)
    Lse,  # fp32 [Hq, total_q] natural log-sum-exp of each row (HAS_LSE only)
    stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_btb, stride_lse_h,
    num_bh, num_heads_q, kv_group, max_seqlen_q, max_blocks, num_pages,
    total_q,  # rows of Q and Out
    total_k,  # rows of K and V (contiguous K/V only)
    qk_scale,  # log2 units: softmax_scale * log2(e), or softcap * log2(e) with SOFTCAP
    softcap_scale,  # softmax_scale / softcap (SOFTCAP only)
    window_left, window_right,  # keys [i + Sk - Sq - left, i + Sk - Sq + right]; right = 0 when causal
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    GROUP: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, LAZY: tl.constexpr, PRECISION: tl.constexpr,
    USE_TMA: tl.constexpr,  # load Q/K/V through per-sequence tensor descriptors (contiguous K/V, 16-byte aligned)
    HAS_SEQUSED: tl.constexpr,  # sequence b attends to its first SeqUsedK[b] keys
    HAS_LSE: tl.constexpr,  # write each row's log-sum-exp
):
    # Longest first, GROUP (sequence, head) pairs at a time.
    pid = tl.program_id(0)
    num_m_blocks = tl.cdiv(max_seqlen_q, BLOCK_M)
    group = pid // (GROUP * num_m_blocks)
    first = group * GROUP
    group_size = tl.minimum(num_bh - first, GROUP)
    r = pid - group * GROUP * num_m_blocks
    start_m = num_m_blocks - 1 - r // group_size
    bh = first + r % group_size
    b = bh // num_heads_q
    h = bh % num_heads_q
    h_kv = h // kv_group

    # rows clamped into the tensors: unchecked cu_seqlens never move an access out of bounds
    q_start = tl.minimum(tl.maximum(tl.load(CuQ + b), 0), total_q)
    q_len = tl.minimum(tl.maximum(tl.load(CuQ + b + 1), q_start), total_q) - q_start
    if start_m * BLOCK_M >= q_len:
        return
    if PAGED:  # cu_seqlens_k gives lengths only: at most the block table's capacity
        kv_start = tl.zeros([], dtype=tl.int64)
        kv_len = tl.minimum(tl.maximum(tl.load(CuK + b + 1).to(tl.int64) - tl.load(CuK + b), 0),
                            max_blocks * PAGE_SIZE).to(tl.int32)
    else:
        kv_start = tl.minimum(tl.maximum(tl.load(CuK + b), 0), total_k).to(tl.int64)
        kv_len = (tl.minimum(tl.maximum(tl.load(CuK + b + 1), kv_start), total_k) - kv_start).to(tl.int32)
    if HAS_SEQUSED:  # clamped to the sequence's keys (its cu_seqlens_k rows, or the block table's capacity)
        kv_len = tl.minimum(tl.maximum(tl.load(SeqUsedK + b), 0), max_blocks * PAGE_SIZE if PAGED else kv_len)
    q_off = kv_len - q_len  # bottom-right alignment

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < q_len
    q_rows = (q_start + offs_m).to(tl.int64)
    K += h_kv.to(tl.int64) * stride_kh
    V += h_kv.to(tl.int64) * stride_vh
    if USE_TMA:
        q_base = Q + q_start.to(tl.int64) * stride_qt + h * stride_qh
        q_desc = tl.make_tensor_descriptor(q_base, shape=[tl.maximum(q_len, 1), HEAD_DIM], strides=[stride_qt, 1],
                                           block_shape=[BLOCK_M, BLOCK_D])
        q = q_desc.load([start_m * BLOCK_M, 0])
        rows_k = tl.maximum(kv_len, 1)  # a descriptor needs a non-empty shape; an empty sequence loads nothing
        k_src = tl.make_tensor_descriptor(K + kv_start * stride_kt, shape=[rows_k, HEAD_DIM], strides=[stride_kt, 1],
                                          block_shape=[BLOCK_N, BLOCK_D])
        v_src = tl.make_tensor_descriptor(V + kv_start * stride_vt, shape=[rows_k, HEAD_DIM], strides=[stride_vt, 1],
                                          block_shape=[BLOCK_N, BLOCK_D])
    else:
        q_ptrs = Q + q_rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :]
        q = tl.load(q_ptrs, mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
        k_src = K
        v_src = V

    # Key range [lo, hi) of the block, and its fully visible part [full_lo, full_hi).
    m_first = start_m * BLOCK_M
    m_last = tl.minimum(m_first + BLOCK_M, q_len) - 1
    hi = kv_len
    full_hi = kv_len
    if HAS_RIGHT:
        hi = tl.minimum(hi, tl.maximum(m_last + q_off + window_right + 1, 0))
        full_hi = tl.minimum(full_hi, tl.maximum(m_first + q_off + window_right + 1, 0))
    lo = 0
    full_lo = 0
    if HAS_LEFT:
        lo = tl.maximum(m_first + q_off - window_left, 0) // BLOCK_N * BLOCK_N
        full_lo = tl.cdiv(tl.maximum(m_last + q_off - window_left, 0), BLOCK_N) * BLOCK_N
    full_hi = lo + tl.maximum(full_hi - lo, 0) // BLOCK_N * BLOCK_N
    full_lo = tl.minimum(tl.maximum(full_lo, lo), full_hi)

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + NEG_BIG
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    if HAS_LEFT:
        acc, l_i, m_i = _attn_loop(acc, l_i, m_i, q, k_src, v_src, BlockTable, lo, full_lo,
            offs_m, offs_d, b, kv_start, kv_len, q_off, stride_btb, max_blocks, num_pages,
            stride_kb, stride_kt, stride_vb, stride_vt, qk_scale, softcap_scale, window_left, window_right, HEAD_DIM,
            BLOCK_N, True, HAS_LEFT, HAS_RIGHT, SOFTCAP, PAGED, PAGE_SIZE, EVEN_D, LAZY, PRECISION, USE_TMA)
    acc, l_i, m_i = _attn_loop(acc, l_i, m_i, q, k_src, v_src, BlockTable, full_lo, full_hi,
        offs_m, offs_d, b, kv_start, kv_len, q_off, stride_btb, max_blocks, num_pages,
        stride_kb, stride_kt, stride_vb, stride_vt, qk_scale, softcap_scale, window_left, window_right, HEAD_DIM,
        BLOCK_N, False, HAS_LEFT, HAS_RIGHT, SOFTCAP, PAGED, PAGE_SIZE, EVEN_D, LAZY, PRECISION, USE_TMA)
    acc, l_i, m_i = _attn_loop(acc, l_i, m_i, q, k_src, v_src, BlockTable, full_hi, hi,
        offs_m, offs_d, b, kv_start, kv_len, q_off, stride_btb, max_blocks, num_pages,
        stride_kb, stride_kt, stride_vb, stride_vt, qk_scale, softcap_scale, window_left, window_right, HEAD_DIM,
        BLOCK_N, True, HAS_LEFT, HAS_RIGHT, SOFTCAP, PAGED, PAGE_SIZE, EVEN_D, LAZY, PRECISION, USE_TMA)

    # A row that saw no key has l == 0 and acc == 0: it outputs 0.
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o_ptrs = Out + q_rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
    if HAS_LSE:
        tl.store(Lse + h.to(tl.int64) * stride_lse_h + q_rows, natural_lse(m_i, l_i), mask=row_ok)


# --- autotuning (CUDA; the interpreter runs one fixed configuration) --------------------------------


def _prefill_smem(cfg: triton.Config, block_d: int, elem: int) -> int:
    """Shared memory of a configuration: the Q tile plus `num_stages` K and V tiles."""
    bm, bn = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"]
    return (bm * block_d + cfg.num_stages * 2 * bn * block_d) * elem


def tma_layout_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, paged: bool) -> bool:
    """Whether Q/K/V can be read through tensor descriptors: contiguous K/V, 16-byte aligned bases, token
    and head strides and head dim."""
    unit = 16 // q.element_size()
    return not paged and q.shape[-1] % unit == 0 and all(
        t.data_ptr() % 16 == 0 and t.stride(0) % unit == 0 and t.stride(1) % unit == 0 for t in (q, k, v))


@functools.cache
def _has_tma(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def _prune_prefill(configs: list[triton.Config], named_args: dict[str, Any], **kwargs: Any) -> list[triton.Config]:
    """Drop what does not fit in shared memory, and the TMA configurations where TMA cannot read the inputs
    (before sm_90, paged K/V, misaligned views). The common path (fp16/bf16, contiguous K/V, no left
    window, no softcap) times the first five left; any other path takes the first (less compiling)."""
    q = named_args["Q"]
    elem = q.element_size()
    # float32 reads through pointers: its float64 score tiles already fill most of the shared memory
    tma = elem == 2 and q.is_cuda and _has_tma(q.device.index or 0) and tma_layout_ok(
        q, named_args["K"], named_args["V"], kwargs["PAGED"])
    usable = [c for c in configs if (tma or not c.kwargs["USE_TMA"])
              and _prefill_smem(c, kwargs["BLOCK_D"], elem) <= SMEM_BUDGET] or configs[-1:]
    common = elem == 2 and not (kwargs["PAGED"] or kwargs["SOFTCAP"] or kwargs["HAS_LEFT"])
    return usable[:5] if common else usable[:1]


def _prefill_configs() -> list[triton.Config]:
    # (BLOCK_M, BLOCK_N, num_warps, num_stages, LAZY, USE_TMA), best guesses for sm_90 first. The last one
    # fits every head dim and dtype (64 x 256 fp32 Q plus two stages of 32 x 256 fp32 K and V: 192 KB).
    shapes = [(128, 64, 8, 3, True, True), (128, 128, 8, 2, True, True), (128, 64, 8, 3, False, True),
              (128, 64, 8, 3, True, False), (64, 64, 4, 3, True, False), (64, 64, 4, 2, True, True),
              (64, 32, 4, 2, True, False)]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "LAZY": lazy, "USE_TMA": tma},
                          num_warps=w, num_stages=s) for bm, bn, w, s, lazy, tma in shapes]


attn_fwd_tuned = triton.autotune(
    _prefill_configs(), key=["HEAD_DIM", "HAS_LEFT", "HAS_RIGHT", "SOFTCAP", "PAGED", "HAS_SEQUSED", "HAS_LSE"],
    prune_configs_by={"early_config_prune": _prune_prefill},
)(attn_fwd_kernel)

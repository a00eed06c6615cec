"""SSD step 3 of 3: each chunk's outputs from the state entering it and the chunk's own tokens.

For token ``t`` of chunk ``c`` (head ``h``, group ``g``; ``cs``, ``dt``, ``seg`` from step 1, ``S`` the
state entering the chunk: the initial state (or 0) for the first chunk (for a packed row: the sequence's own
for each sequence's first chunk), else the state step 2 left at the end of the chunk before;
``cb[t, s] = C[t] . B[s]`` from step 2b)::

    y[t] = exp(cs[t]) * [seg[t] == 0] * C[t] . S
         + sum_{s <= t, seg[s] == seg[t]} cb[t, s] * exp(cs[t] - cs[s]) * dt[s] * x[s]
         + D * x[t]
    y[t] *= silu(z[t])            (when z is given)

One program computes a ``BLOCK_M x BLOCK_P`` tile of y: the ``C . S`` term over ``BLOCK_NS`` slices of N,
then the causal ``cb`` blocks, each weighted and multiplied by x: first the blocks wholly below the diagonal
(every pair kept: no causal or length mask), then the diagonal block(s) with the masks. In the full blocks,
when every ``|cs|`` the program meets lies within `FACTOR_LIMIT` of the row block's first ``cs``
(``FACTORED``), ``exp(cs[t] - cs[s])`` is taken as ``exp(cs[t] - r) * exp(r - cs[s])``: one exponential per
row and per column instead of one per pair, both factors within ``e^40`` of 1 so their product is as exact
as the direct one; otherwise (strong decays, non-finite ``cs``) the direct form. The fp32 operands (the
state, the weighted ``cb``) stay fp32: for 16-bit inputs each product takes a form of `_ssd_common`
(``STATE_PRODUCT`` for ``C . S``, ``PRODUCT`` for the weighted ``cb`` times x, `dot_f32_right`,
`dot_f32_left`; by default ``SPLIT``: two tensor-core products that keep the fp32 operand exact, so only the
output is rounded to the inputs' dtype; ``ROUND`` rounds it to the inputs' dtype for one product, as mamba_ssm's
chunk scan multiplies);
with ``PRESPLIT``, step 2 stored the state split already (two plain products, no split per program; the
high half alone when ``STATE_PRODUCT`` rounds). Programs run heads
first, so the heads of one chunk read the same ``cb`` tiles while they are in L2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infiniops_triton._common import cdiv, next_power_of_2
from infiniops_triton._ssd_common import (
    ROUND,
    SPLIT,
    autotune_configs,
    dot_f32_left,
    dot_f32_right,
    dot_precision,
    fast_exp,
    fit_to_chunk,
)

__all__ = ["CONFIGS", "FACTORED", "PRODUCT", "STATE_PRODUCT", "chunk_scan"]

# One configuration per chunk class, no timing at run time: the fastest of 14 in benchmarks/gpu_sweep_scan.py
# on the H200 (0.231 ms at 8 x 2048), 128 registers per thread (4 programs per SM); chunks of 32 take the
# 32-row one. (The state read 128 columns at a time was faster only with the products rounded, below.)
CONFIGS = [
    {"BLOCK_M": 64, "BLOCK_K": 32, "BLOCK_P": 64, "BLOCK_NS": 32, "num_warps": 4, "num_stages": 2, "maxnreg": 128},
    {"BLOCK_M": 32, "BLOCK_K": 32, "BLOCK_P": 64, "BLOCK_NS": 32, "num_warps": 4, "num_stages": 2},  # chunk 32
]
FACTORED = False  # the default of the FACTORED switch (module docstring): off until the sweep measures it
FACTOR_LIMIT = tl.constexpr(40.0)
_ROUND = tl.constexpr(ROUND)  # the kernel reads module globals only as constexprs
# The product forms per 16-bit input dtype (`_ssd_common`): the weighted cb times x, and C times the state;
# a launch configuration's "PRODUCT" / "STATE_PRODUCT" override them.
# ROUND (mamba_ssm's rounding, 1.5x faster chunk scan) broke the bf16 tolerance in the H200's conformance run
# (up to 59 of 2.5M elements at L 2436, chunk 16, initial states and seq_idx; RESULTS.md, session 10): SPLIT.
PRODUCT: dict[torch.dtype, int] = {torch.float16: SPLIT, torch.bfloat16: SPLIT}
STATE_PRODUCT: dict[torch.dtype, int] = {torch.float16: SPLIT, torch.bfloat16: SPLIT}


@triton.jit
def _full_blocks(acc, cb_rows, cs_tok, dt_tok, seg_tok, x_cols, stride_x_l, cs_m, seg_m, mask_p, ref, full_end,
                 FACTORED: tl.constexpr, HAS_SEQ_IDX: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 PRODUCT: tl.constexpr, BLOCK_K: tl.constexpr):
    """`acc` plus the products of the column blocks before `full_end` (wholly below the diagonal, within the
    chunk): no causal or length mask; decays ``exp(cs_m - cs_s)``, or ``exp(cs_m - ref) * exp(ref - cs_s)``
    when `FACTORED` (the caller checked the range). `cs_tok`, `dt_tok`, `seg_tok`: the chunk's first token."""
    if FACTORED:
        row_f = fast_exp(cs_m - ref)
    for k0 in range(0, full_end, BLOCK_K):
        offs_s = k0 + tl.arange(0, BLOCK_K)
        cb = tl.load(cb_rows + offs_s[None, :])  # [BLOCK_M, BLOCK_K]; rows past a short chunk hold zeros
        cs_s = tl.load(cs_tok + offs_s)
        dt_s = tl.load(dt_tok + offs_s)
        if FACTORED:
            w = cb * row_f[:, None] * (fast_exp(ref - cs_s) * dt_s)[None, :]
        else:
            w = cb * fast_exp(cs_m[:, None] - cs_s[None, :]) * dt_s[None, :]
        if HAS_SEQ_IDX:
            seg_s = tl.load(seg_tok + offs_s)
            w = tl.where(seg_m[:, None] == seg_s[None, :], w, 0.0)
        xs = tl.load(x_cols + offs_s[:, None] * stride_x_l, mask=mask_p[None, :], other=0.0)
        acc = dot_f32_left(w, xs, acc, DOT_PRECISION, PRODUCT)
    return acc


@triton.autotune(
    configs=autotune_configs(
        CONFIGS, interpreter={"BLOCK_M": 16, "BLOCK_K": 16, "BLOCK_P": 16, "BLOCK_NS": 16, "num_warps": 4,
                              "num_stages": 1},
    ),
    key=["CHUNK", "P", "N", "WORK"],
    prune_configs_by={"early_config_prune": fit_to_chunk},
)
@triton.jit(do_not_specialize=["L", "H", "G", "nchunks", "heads_per_group", "WORK"])
def _chunk_scan_kernel(
    x_ptr,  # [Bt, L, H, P], any strides
    z_ptr,  # [Bt, L, H, P] (read when HAS_Z)
    out_ptr,  # out: [Bt, L, H, P] in x's dtype
    c_ptr,  # [Bt, L, G, N]
    cb_ptr,  # [Bt, nchunks, G, CHUNK, CHUNK] fp32 contiguous: C B^T within each chunk (on/below the diagonal)
    d_ptr,  # [H] or [H, P] (read when HAS_D; stride_d_p is 0 for [H])
    states_ptr,  # [Bt, nchunks, H, P, N] fp32 contiguous: the state at the end of each chunk (step 2)
    hilo_ptr,  # [Bt, nchunks, H, 2, P, N] 16-bit contiguous: the state entering each chunk, split (PRESPLIT)
    init_ptr,  # [Bt, H, P, N] fp32 initial states, any strides (read when HAS_INIT)
    dt_ptr,  # [Bt, H, nchunks, CHUNK] fp32 contiguous: processed dt
    cs_ptr,  # [Bt, H, nchunks, CHUNK] fp32 contiguous: chunk-relative cumsum of dt * A
    seg_ptr,  # [Bt, nchunks, CHUNK] int32 contiguous (read when HAS_SEQ_IDX)
    table_ptr,  # [4, nchunks] int32: starts, lengths, first-of-a-sequence flags, sequences (read when VARLEN)
    L, H, G, P, N, nchunks, heads_per_group,
    stride_x_b, stride_x_l, stride_x_h, stride_x_p,
    stride_z_b, stride_z_l, stride_z_h, stride_z_p,
    stride_o_b, stride_o_l, stride_o_h, stride_o_p,
    stride_c_b, stride_c_l, stride_c_g, stride_c_n,
    stride_d_h, stride_d_p,
    stride_init_b, stride_init_h, stride_init_p, stride_init_n,
    WORK,  # autotune key only: log2 of the number of (row, chunk, head) triples
    CHUNK: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_SEQ_IDX: tl.constexpr,
    HAS_INIT: tl.constexpr,
    VARLEN: tl.constexpr,  # chunks from table_ptr; a sequence's first chunk starts from its initial state
    DOT_PRECISION: tl.constexpr,
    FACTORED: tl.constexpr,  # separable decays in the full blocks where the range allows
    PRESPLIT: tl.constexpr,  # read the entering state from hilo (split by step 2), not from states / init
    PRODUCT: tl.constexpr,  # the form of the weighted cb times x (_ssd_common: SPLIT, TF32, ROUND)
    STATE_PRODUCT: tl.constexpr,  # the form of C times the entering state
    BLOCK_N: tl.constexpr,  # >= N: the whole state dimension
    BLOCK_NS: tl.constexpr,  # the state-dimension slice of one C . S product (a power of two)
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    # One flat axis, heads fastest: the heads of one (chunk, row block) share cb and C tiles in L2.
    p_tiles = tl.cdiv(P, BLOCK_P)
    m_tiles = tl.cdiv(CHUNK, BLOCK_M)
    pid = tl.program_id(0)
    pid_p = pid % p_tiles
    h = (pid // p_tiles) % H
    pid_m = (pid // (p_tiles * H)) % m_tiles
    pid_bc = pid // (p_tiles * H * m_tiles)
    b = pid_bc // nchunks
    c = pid_bc % nchunks
    b64 = b.to(tl.int64)
    if VARLEN:  # the state entering a sequence's first chunk is that sequence's initial state (or zero)
        start = tl.load(table_ptr + c)
        chunk_len = tl.load(table_ptr + nchunks + c)
        from_init = tl.load(table_ptr + 2 * nchunks + c) != 0
        init_row = tl.load(table_ptr + 3 * nchunks + c).to(tl.int64)
    else:  # the state entering chunk 0 is the row's initial state (or zero)
        start = c * CHUNK
        chunk_len = tl.minimum(CHUNK, L - start)
        from_init = c == 0
        init_row = b64
    if pid_m * BLOCK_M >= chunk_len:  # past the end of a short last chunk
        return
    g = h // heads_per_group
    start64 = start.to(tl.int64)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    mask_m = offs_m < chunk_len
    mask_p = offs_p < P
    tok_base = ((b64 * H + h) * nchunks + c) * CHUNK
    cs_m = tl.load(cs_ptr + tok_base + offs_m, mask=mask_m, other=-float("inf"))  # rows past the end: no weight
    seg_base = seg_ptr + (b64 * nchunks + c) * CHUNK  # read when HAS_SEQ_IDX
    seg_m = offs_m  # a placeholder without seq_idx
    if HAS_SEQ_IDX:
        seg_m = tl.load(seg_base + offs_m, mask=mask_m, other=0)

    acc = tl.zeros((BLOCK_M, BLOCK_P), dtype=tl.float32)
    has_state = ~from_init  # a chunk entered from no initial state starts from zero (no product at all)
    if HAS_INIT:
        has_state = c >= 0
    if has_state:
        # C . S over the state dimension in BLOCK_NS slices (a whole fp32 state tile and its split halves
        # would hold most of the registers). Scalar int64 bases plus int32 tile offsets throughout.
        c_base = c_ptr + b64 * stride_c_b + start64 * stride_c_l + g * stride_c_g
        prev_chunk = tl.maximum(c - 1, 0).to(tl.int64)
        st_base = states_ptr + ((b64 * nchunks + prev_chunk) * H + h) * P * N
        split_base = hilo_ptr + ((b64 * nchunks + c) * H + h) * 2 * P * N  # hi, then lo P * N further
        if HAS_INIT:
            init_base = init_ptr + init_row * stride_init_b + h * stride_init_h
        for n0 in range(0, BLOCK_N, BLOCK_NS):
            offs_n = n0 + tl.arange(0, BLOCK_NS)
            mask_n = offs_n < N
            mask_np = mask_n[:, None] & mask_p[None, :]
            cm = tl.load(  # [BLOCK_M, BLOCK_NS]
                c_base + offs_m[:, None] * stride_c_l + offs_n[None, :] * stride_c_n,
                mask=mask_m[:, None] & mask_n[None, :], other=0.0,
            )
            offs_np = offs_p[None, :] * N + offs_n[:, None]  # [BLOCK_NS, BLOCK_P]: the state, transposed
            if PRESPLIT:
                acc = tl.dot(cm, tl.load(split_base + offs_np, mask=mask_np, other=0.0), acc)
                if STATE_PRODUCT != _ROUND:
                    acc = tl.dot(cm, tl.load(split_base + P * N + offs_np, mask=mask_np, other=0.0), acc)
            else:
                st_ptrs = st_base + offs_np
                if HAS_INIT:
                    init_ptrs = init_base + (offs_p[None, :] * stride_init_p + offs_n[:, None] * stride_init_n)
                    st_ptrs = tl.where(from_init, init_ptrs, st_ptrs)
                st = tl.load(st_ptrs, mask=mask_np, other=0.0)
                acc = dot_f32_right(cm, st, acc, DOT_PRECISION, STATE_PRODUCT)
        acc *= fast_exp(cs_m)[:, None]
        if HAS_SEQ_IDX:  # rows after a restart in this chunk do not see the entering state
            acc = tl.where(seg_m[:, None] == 0, acc, 0.0)

    cb_rows = cb_ptr + ((b64 * nchunks + c) * G + g) * CHUNK * CHUNK + offs_m[:, None] * CHUNK
    x_base = x_ptr + b64 * stride_x_b + start64 * stride_x_l + h * stride_x_h
    x_cols = x_base + offs_p[None, :] * stride_x_p

    # Full blocks: every column s lies before the row block (s < t, s < chunk_len): no causal mask, and
    # cb, cs, dt exist for every (row, column) loaded (cb rows past a short chunk hold zeros from step 2b).
    full_end = (pid_m * BLOCK_M) // BLOCK_K * BLOCK_K
    if FACTORED:
        ref = tl.load(cs_ptr + tok_base + pid_m * BLOCK_M)  # cs of the row block's first token
        offs_all = tl.arange(0, CHUNK)
        cs_all = tl.load(cs_ptr + tok_base + offs_all, mask=offs_all < full_end, other=0.0)
        far = (tl.sum(tl.where(tl.abs(cs_all - ref) < FACTOR_LIMIT, 0, 1), axis=0)  # NaN counts as far
               + tl.sum(tl.where(tl.abs(tl.where(mask_m, cs_m, ref) - ref) < FACTOR_LIMIT, 0, 1), axis=0))
        if far == 0:  # one loop per form, so that each holds only its own registers
            acc = _full_blocks(acc, cb_rows, cs_ptr + tok_base, dt_ptr + tok_base, seg_base, x_cols, stride_x_l,
                               cs_m, seg_m, mask_p, ref, full_end, True, HAS_SEQ_IDX, DOT_PRECISION, PRODUCT,
                               BLOCK_K)
        else:
            acc = _full_blocks(acc, cb_rows, cs_ptr + tok_base, dt_ptr + tok_base, seg_base, x_cols, stride_x_l,
                               cs_m, seg_m, mask_p, ref, full_end, False, HAS_SEQ_IDX, DOT_PRECISION, PRODUCT,
                               BLOCK_K)
    else:
        acc = _full_blocks(acc, cb_rows, cs_ptr + tok_base, dt_ptr + tok_base, seg_base, x_cols, stride_x_l,
                           cs_m, seg_m, mask_p, 0.0, full_end, False, HAS_SEQ_IDX, DOT_PRECISION, PRODUCT,
                           BLOCK_K)

    # The diagonal block(s): the causal and length masks.
    for k0 in range(full_end, tl.minimum((pid_m + 1) * BLOCK_M, chunk_len), BLOCK_K):
        offs_s = k0 + tl.arange(0, BLOCK_K)
        mask_s = offs_s < chunk_len
        keep = (offs_m[:, None] >= offs_s[None, :]) & mask_s[None, :]
        cb = tl.load(cb_rows + offs_s[None, :], mask=keep & mask_m[:, None], other=0.0)  # [BLOCK_M, BLOCK_K]
        cs_s = tl.load(cs_ptr + tok_base + offs_s, mask=mask_s, other=0.0)
        dt_s = tl.load(dt_ptr + tok_base + offs_s, mask=mask_s, other=0.0)
        if HAS_SEQ_IDX:
            seg_s = tl.load(seg_base + offs_s, mask=mask_s, other=-1)
            keep &= seg_m[:, None] == seg_s[None, :]
        # Only kept pairs reach exp (s > t would grow) and the product (0 * inf from another sequence).
        decay = fast_exp(tl.where(keep, cs_m[:, None] - cs_s[None, :], 0.0))
        w = tl.where(keep, cb * decay * dt_s[None, :], 0.0)
        xs = tl.load(x_cols + offs_s[:, None] * stride_x_l, mask=mask_s[:, None] & mask_p[None, :], other=0.0)
        acc = dot_f32_left(w, xs, acc, DOT_PRECISION, PRODUCT)

    mask_mp = mask_m[:, None] & mask_p[None, :]
    if HAS_D:
        xm = tl.load(
            x_base + offs_m[:, None] * stride_x_l + offs_p[None, :] * stride_x_p, mask=mask_mp, other=0.0,
        ).to(tl.float32)
        dv = tl.load(d_ptr + h * stride_d_h + offs_p * stride_d_p, mask=mask_p, other=0.0).to(tl.float32)
        acc += xm * dv[None, :]
    if HAS_Z:
        zm = tl.load(
            (z_ptr + b64 * stride_z_b + start64 * stride_z_l + h * stride_z_h)
            + (offs_m[:, None] * stride_z_l + offs_p[None, :] * stride_z_p),
            mask=mask_mp, other=0.0,
        ).to(tl.float32)
        acc *= zm * tl.sigmoid(zm)
    out = ((out_ptr + b64 * stride_o_b + start64 * stride_o_l + h * stride_o_h)
           + (offs_m[:, None] * stride_o_l + offs_p[None, :] * stride_o_p))
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask_mp)


def chunk_scan(
    x: torch.Tensor,
    z: torch.Tensor | None,
    C: torch.Tensor,
    D: torch.Tensor | None,
    cb: torch.Tensor,
    states: torch.Tensor,
    initial_states: torch.Tensor | None,
    dt_proc: torch.Tensor,
    cs: torch.Tensor,
    seg: torch.Tensor | None,
    chunk_size: int,
    out: torch.Tensor,
    config: dict[str, int] | None = None,
    hilo: torch.Tensor | None = None,
    table: torch.Tensor | None = None,
) -> None:
    """Launch step 3: write `out` ``[Bt, L, H, P]`` (x's dtype) from the buffers of steps 1, 2 and 2b.

    `states` fp32 ``[Bt, nchunks, H, P, N]`` holds the state at the end of each chunk (step 2); D ``[H]``
    or ``[H, P]``; z like x or None; seg None without seq_idx; `initial_states` fp32 ``[Bt, H, P, N]`` or None.
    `config`: fixed ``BLOCK_M``, ``BLOCK_K``, ``BLOCK_P``, ``BLOCK_NS``, ``num_warps``, ``num_stages`` (and
    optionally ``FACTORED``, ``maxnreg``) instead of the autotuner's pick (benchmarks/gpu_sweep_scan.py);
    BLOCK_M, BLOCK_K at most the chunk; ``FACTORED``, ``PRODUCT`` and ``STATE_PRODUCT`` in it (alone or with
    the rest) override the module's defaults. `hilo` (16-bit inputs): the state entering each chunk split by
    `state_passing` (``[Bt, nchunks, H, 2, P, N]``), read instead of `states` and `initial_states`.
    `table` (a packed row): the int32 ``[4, nchunks]`` chunk table of `_ssd_chunk_state.chunk_state`; then
    `initial_states` is per sequence ``[S, H, P, N]`` and enters each sequence's first chunk (no `hilo`).
    """
    bt, seqlen, nheads, headdim = x.shape
    ngroups, dstate = C.shape[2], C.shape[3]
    nchunks = states.shape[1]
    init = initial_states if initial_states is not None else states
    init_strides = initial_states.stride() if initial_states is not None else (0, 0, 0, 0)
    zt = z if z is not None else x
    if D is None:
        d, d_strides = x, (0, 0)
    else:
        d, d_strides = D, (D.stride(0), D.stride(1) if D.dim() == 2 else 0)

    def grid(meta: dict) -> tuple[int]:
        tiles = cdiv(chunk_size, meta["BLOCK_M"]) * cdiv(headdim, meta["BLOCK_P"])
        return (tiles * nheads * bt * nchunks,)

    block_n = max(16, next_power_of_2(dstate))
    switches = {"FACTORED": FACTORED, "PRODUCT": PRODUCT.get(x.dtype, SPLIT),
                "STATE_PRODUCT": STATE_PRODUCT.get(x.dtype, SPLIT)}
    meta = {**switches, **(config or {})}
    kernel = _chunk_scan_kernel if meta.keys() == switches.keys() else _chunk_scan_kernel.fn
    kernel[grid](
        x, zt, out, C, cb, d, states, hilo if hilo is not None else C, init, dt_proc, cs,
        seg if seg is not None else cs, table if table is not None else cs,
        seqlen, nheads, ngroups, headdim, dstate, nchunks, nheads // ngroups,
        *x.stride(), *zt.stride(), *out.stride(), *C.stride(), *d_strides, *init_strides,
        (bt * nchunks * nheads).bit_length(),
        CHUNK=chunk_size,
        HAS_D=D is not None,
        HAS_Z=z is not None,
        HAS_SEQ_IDX=seg is not None,
        HAS_INIT=initial_states is not None,
        VARLEN=table is not None,
        PRESPLIT=hilo is not None,
        DOT_PRECISION=dot_precision(x.dtype),
        BLOCK_N=block_n,
        **meta,
    )

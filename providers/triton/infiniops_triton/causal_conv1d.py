"""causal_conv1d and its decode step as Triton kernels (Dao-AILab/causal-conv1d semantics, the contract's
decisions on ``seq_idx`` runs, initial and final states).

Prefill: a program computes a ``[BLOCK_D, BLOCK_L]`` tile of one row as ``W`` shifted loads of x (the
overlap hits L1/L2, so memory is read about once), fp32 accumulation, bias and SiLU fused. Either layout is
read through strides; the tile's long side follows the unit-stride dim so loads stay coalesced. With
``seq_idx`` a tap ``j`` positions back counts only while ``seq_idx`` has not changed between it and the
output position (a chain of ``W - 1`` equality tests); positions before 0 read ``initial_states`` and
belong to the row's first sequence. The last time tile of each row also writes the final states.
Channel-first input without ``seq_idx`` (W <= 8) takes a second kernel: there the shifted windows would be
misaligned loads along the unit stride, so it loads the tile and the 8 columns before each group of 8
(two aligned vector loads) and picks the taps from registers (`_conv_taps`); above `TUNE_MIN_NUMEL`
elements it autotunes its tile among a few shapes and warp counts. Channel-last input without
``seq_idx`` (W <= 8) takes a third: a program owns a run of time rows of a block of channels
(`ChannelLastTile`: 128 rows of up to 512 channels, 4 warps, by default) and walks it 8 rows at a time,
each row one coalesced vector load held in registers, carrying the last W-1 rows in registers to the next
8; only the W-1 rows before the run are loaded twice, so x is read about once (the generic kernel's W
shifted loads mostly miss L1 and cost W times the traffic in L2; 8-row programs reloaded (W-1)/8 of x and
the taps). The default tile was measured best on the H200 by benchmarks/gpu_sweep_conv.py: 86% of the
copy bandwidth on bf16 ``[8, 4096, 4096]``, W=4, bias and SiLU (64x1024 took 80%, 8-row programs 64%;
loading the next 8 rows while the current 8 compute lost on every tile, 64-83%). SiLU divides
approximately (2 ulp).

Size arguments are compiled for their value class (1, a multiple of 16, other) only where that decides the
vector width: a size that bounds a mask along the unit stride (D channel-last, L channel-first; the generic
kernel, which reads either layout, is compiled twice, once per layout); the others are
``do_not_specialize``, so the many shapes of a conformance run do not each compile a kernel.

Decode: a program owns ``BLOCK_D`` channels of one row: it reads the slot's ``S`` state columns and the
row's ``L`` new columns, writes the ``L`` outputs, then (after a barrier, since it overwrites what it
read) the last ``S`` columns back into the slot; with ``cache_seqlens`` the slot is circular: the taps
read the W-1 columns before the write position and the new columns are written from it on, mod S. A
negative or out-of-range slot outputs 0 and touches no state.

The packed form of the prefill (vLLM's, ``query_start_loc``) is not served here: the capability gates it
(``varlen``) to the torch provider.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from infiniops_py import Between, Capability, Implementation, OneOf
from infiniops_py.operators.causal_conv1d import MAX_WIDTH, MIN_WIDTH
from infiniops_triton._common import PRIORITY, base_constraints
from infiniops_triton._conv_taps import column8, conv_taps8, tap_weight

__all__ = ["IMPLEMENTATIONS", "causal_conv1d", "causal_conv1d_update"]

MAX_STATE_LEN = 1024  # the decode step holds a slot's state columns in registers
_FAST_MAX_WIDTH = 8  # the channel-first kernel reads taps from the previous group of 8 columns only
_ELEMS_PER_PROGRAM = 4096
TUNE_MIN_NUMEL = 1 << 24  # channel-first inputs this large autotune their tile (once per D and size class)


@triton.jit
def _silu(y):
    # approximate division (2 ulp): an IEEE fp32 divide costs more instructions than the rest of the tap
    return tl.fdiv(y, 1.0 + tl.exp(-y), ieee_rounding=False)


@triton.jit
def _load_taps(WEIGHT, d, d_mask, stride_wd, stride_ww, W: tl.constexpr):
    """The ``[BLOCK_D, next_power_of_2(W)]`` taps of the channels as one vectorized fp32 tile: per-tap loads
    would be scalar loads strided by W, which in a channel-last tile cost more L1 traffic than x itself."""
    k = tl.arange(0, triton.next_power_of_2(W))
    taps = tl.load(WEIGHT + d[:, None] * stride_wd + k[None, :] * stride_ww, mask=d_mask[:, None] & (k < W)[None, :],
                   other=0.0)
    return taps.to(tl.float32)


@triton.jit
def _tap(taps, k: tl.constexpr):
    """Column k of `taps` as ``[BLOCK_D, 1]`` (an in-register select and sum)."""
    cols = tl.arange(0, taps.shape[1])
    return tl.sum(tl.where(cols[None, :] == k, taps, 0.0), axis=1)[:, None]


def _conv(
    X,  # *dtype [B, D, L] input, any strides
    WEIGHT,  # *float [D, W] taps (the last tap multiplies the current position)
    BIAS,  # *float [D]; unused unless HAS_BIAS
    SEQ,  # *int32 [B, L] sequence ids; unused unless HAS_SEQ
    INIT,  # *dtype [B, D, W-1] initial states; unused unless HAS_INIT
    OUT,  # *dtype [B, D, L] output
    FINAL,  # *dtype [B, D, W-1] final states to fill; unused unless HAS_FINAL
    D, L,
    stride_xb, stride_xd, stride_xl,
    stride_wd, stride_ww,
    stride_sb, stride_sl,
    stride_ib, stride_id, stride_iw,
    stride_ob, stride_od, stride_ol,
    stride_fb, stride_fd, stride_fw,
    W: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    HAS_SEQ: tl.constexpr,
    HAS_INIT: tl.constexpr,
    HAS_FINAL: tl.constexpr,
    WIDE: tl.constexpr,  # int64 offsets within a batch row (a row spans 2**31 elements or more)
    BLOCK_D: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_W: tl.constexpr,  # next_power_of_2(W - 1): final-state columns
):
    pid_l = tl.program_id(0)
    pid_d = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    t = pid_l * BLOCK_L + tl.arange(0, BLOCK_L)
    d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    if WIDE:
        t, d = t.to(tl.int64), d.to(tl.int64)
    d_mask = d < D
    t_mask = t < L
    x_row = X + b * stride_xb + d[:, None] * stride_xd
    acc = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)
    if HAS_SEQ:
        seq_t = tl.load(SEQ + b * stride_sb + t * stride_sl, mask=t_mask, other=-1)
        seq_prev = seq_t
        same = t_mask
    taps = _load_taps(WEIGHT, d, d_mask, stride_wd, stride_ww, W)
    for j in tl.static_range(W):  # tap j positions back: weight column W-1-j
        s = t - j
        v = tl.load(x_row + s[None, :] * stride_xl, mask=d_mask[:, None] & ((s >= 0) & t_mask)[None, :], other=0.0)
        v = v.to(tl.float32)
        if HAS_INIT:
            init_ptrs = INIT + b * stride_ib + d[:, None] * stride_id + (s + W - 1)[None, :] * stride_iw
            init_mask = d_mask[:, None] & ((s < 0) & (s + W - 1 >= 0) & t_mask)[None, :]
            v += tl.load(init_ptrs, mask=init_mask, other=0.0).to(tl.float32)
        if HAS_SEQ:
            if j > 0:  # the tap counts while the id has not changed (positions < 0 take position 0's id)
                seq_s = tl.load(SEQ + b * stride_sb + tl.maximum(s, 0) * stride_sl, mask=t_mask, other=-1)
                same = same & (seq_s == seq_prev)
                seq_prev = seq_s
            v = tl.where(same[None, :], v, 0.0)
        acc += _tap(taps, W - 1 - j) * v
    if HAS_BIAS:
        acc += tl.load(BIAS + d, mask=d_mask, other=0.0).to(tl.float32)[:, None]
    if SILU:
        acc = _silu(acc)
    if HAS_SEQ:
        acc = tl.where((seq_t >= 0)[None, :], acc, 0.0)
    out_ptrs = OUT + b * stride_ob + d[:, None] * stride_od + t[None, :] * stride_ol
    tl.store(out_ptrs, acc.to(OUT.dtype.element_ty), mask=d_mask[:, None] & t_mask[None, :])

    if HAS_FINAL:  # noqa: SIM102 (a constexpr gate, then a runtime branch)
        if pid_l == tl.num_programs(0) - 1:
            _store_final_states(x_row, stride_xl, SEQ + b * stride_sb, stride_sl, INIT + b * stride_ib, stride_id,
                                stride_iw, FINAL + b * stride_fb, stride_fd, stride_fw, d, d_mask, L, W, HAS_SEQ,
                                HAS_INIT, BLOCK_W)


# The generic kernel twice: the size bounding the mask along the unit stride stays specialized (its
# divisibility by 16 decides the vector width), the other is not, so random shapes compile fewer kernels.
_conv_kernel = triton.jit(do_not_specialize=["L"])(_conv)  # unit stride along D (channel-last) or none
_conv_kernel_unit_l = triton.jit(do_not_specialize=["D"])(_conv)  # unit stride along L (channel-first)


@triton.jit
def _store_final_states(
    x_row,  # *dtype [BLOCK_D, 1] pointers to x[b, d, 0]
    stride_xl,
    SEQ,  # *int32 [L] this row's sequence ids; unused unless HAS_SEQ
    stride_sl,
    INIT,  # *dtype [D, W-1] this row's initial states; unused unless HAS_INIT
    stride_id, stride_iw,
    FINAL,  # *dtype [D, W-1] this row's final states
    stride_fd, stride_fw,
    d, d_mask, L,
    W: tl.constexpr, HAS_SEQ: tl.constexpr, HAS_INIT: tl.constexpr, BLOCK_W: tl.constexpr,
):
    # column c holds position p = L - (W-1) + c: x when p >= 0, else the initial state column c + L
    c = tl.arange(0, BLOCK_W)
    p = L - (W - 1) + c
    c_mask = d_mask[:, None] & (c < W - 1)[None, :]
    v = tl.load(x_row + p[None, :] * stride_xl, mask=c_mask & (p >= 0)[None, :], other=0.0)
    if HAS_INIT:
        v_init = tl.load(INIT + d[:, None] * stride_id + (p + W - 1)[None, :] * stride_iw,
                         mask=c_mask & (p < 0)[None, :], other=0.0)
        v = tl.where((p >= 0)[None, :], v, v_init)
    if HAS_SEQ:  # keep the columns of the last sequence only
        keep = c >= 0
        for k in tl.static_range(W - 1):
            q = L - 2 - k  # compare positions q and q + 1 (positions < 0 take position 0's id)
            seq_lo = tl.load(SEQ + tl.maximum(q, 0) * stride_sl)
            seq_hi = tl.load(SEQ + tl.maximum(q + 1, 0) * stride_sl)
            keep = keep & ((seq_lo == seq_hi) | (q < p))
        v = tl.where(keep[None, :], v, 0.0)
    tl.store(FINAL + d[:, None] * stride_fd + c[None, :] * stride_fw, v.to(FINAL.dtype.element_ty), mask=c_mask)


@triton.jit(do_not_specialize=["D", "size_class"])
def _conv_channel_first_kernel(
    X,  # *dtype [B, D, L] input with unit stride along L
    WEIGHT,  # *float [D, W], W <= 8
    BIAS,  # *float [D]; unused unless HAS_BIAS
    INIT,  # *dtype [B, D, W-1] initial states; unused unless HAS_INIT
    OUT,  # *dtype [B, D, L] output
    FINAL,  # *dtype [B, D, W-1] final states to fill; unused unless HAS_FINAL
    D, L,
    size_class,  # L.bit_length(): the autotuning key only
    stride_xb, stride_xd, stride_xl,
    stride_wd, stride_ww,
    stride_ib, stride_id, stride_iw,
    stride_ob, stride_od, stride_ol,
    stride_fb, stride_fd, stride_fw,
    W: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    HAS_INIT: tl.constexpr,
    HAS_FINAL: tl.constexpr,
    WIDE: tl.constexpr,  # int64 offsets within a batch row (a row spans 2**31 elements or more)
    BLOCK_W: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_L: tl.constexpr,  # a multiple of 8
):
    # The shifted windows of the generic kernel would be misaligned loads along the unit stride; here the
    # tile and the 8 columns before each group of 8 are two aligned vector loads, and the taps are picked
    # from registers.
    pid_l = tl.program_id(0)
    b = tl.program_id(2).to(tl.int64)
    t = pid_l * BLOCK_L + tl.arange(0, BLOCK_L)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    if WIDE:
        t, d = t.to(tl.int64), d.to(tl.int64)
    d_mask = d < D
    x_row = X + b * stride_xb + d[:, None] * stride_xd
    cur = tl.load(x_row + t[None, :] * stride_xl, mask=d_mask[:, None] & (t < L)[None, :], other=0.0)
    s = t - 8
    prev = tl.load(x_row + s[None, :] * stride_xl, mask=d_mask[:, None] & ((s >= 0) & (s < L))[None, :], other=0.0)
    prev = prev.to(tl.float32)
    if HAS_INIT:  # noqa: SIM102 (a constexpr gate, then a runtime branch)
        if pid_l == 0:  # positions -W+1..-1 come from the initial states
            init_ptrs = INIT + b * stride_ib + d[:, None] * stride_id + (s + W - 1)[None, :] * stride_iw
            init_mask = d_mask[:, None] & ((s < 0) & (s + W - 1 >= 0))[None, :]
            prev += tl.load(init_ptrs, mask=init_mask, other=0.0).to(tl.float32)
    acc = conv_taps8(cur.to(tl.float32), prev, WEIGHT, d, d_mask, stride_wd, stride_ww, W, BLOCK_D, BLOCK_L)
    if HAS_BIAS:
        acc += tl.load(BIAS + d, mask=d_mask, other=0.0).to(tl.float32)[:, None]
    if SILU:
        acc = _silu(acc)
    out_ptrs = OUT + b * stride_ob + d[:, None] * stride_od + t[None, :] * stride_ol
    tl.store(out_ptrs, acc.to(OUT.dtype.element_ty), mask=d_mask[:, None] & (t < L)[None, :])
    if HAS_FINAL:  # noqa: SIM102 (a constexpr gate, then a runtime branch)
        if pid_l == tl.num_programs(0) - 1:
            _store_final_states(x_row, stride_xl, INIT, 0, INIT + b * stride_ib, stride_id, stride_iw,
                                FINAL + b * stride_fb, stride_fd, stride_fw, d, d_mask, L, W, False, HAS_INIT,
                                BLOCK_W)


@triton.jit
def _row(x_b, t, L, d_mask, init_b, stride_xl, stride_iw, USED: tl.constexpr, HAS_INIT: tl.constexpr,
         W: tl.constexpr):
    """Time row `t` of the channels as a ``[BLOCK_D]`` fp32 vector: x when ``0 <= t < L``, the initial state
    column ``t + W - 1`` when ``t < 0`` (`HAS_INIT`), else 0; no load at all when not `USED`."""
    if USED:
        v = tl.load(x_b + t * stride_xl, mask=d_mask & (t >= 0) & (t < L), other=0.0).to(tl.float32)
        if HAS_INIT:
            v += tl.load(init_b + (t + W - 1) * stride_iw, mask=d_mask & (t < 0) & (t + W - 1 >= 0),
                         other=0.0).to(tl.float32)
    else:
        v = tl.zeros(d_mask.shape, dtype=tl.float32)
    return v


@triton.jit
def _finish_row(acc, bias, o_b, t, L, d_mask, stride_ol, HAS_BIAS: tl.constexpr, SILU: tl.constexpr):
    if HAS_BIAS:
        acc += bias
    if SILU:
        acc = _silu(acc)
    tl.store(o_b + t * stride_ol, acc.to(o_b.dtype.element_ty), mask=d_mask & (t < L))


@triton.jit(do_not_specialize=["L"])
def _conv_channel_last_kernel(
    X,  # *dtype [B, D, L] input with unit stride along D
    WEIGHT,  # *float [D, W], W <= 8
    BIAS,  # *float [D]; unused unless HAS_BIAS
    INIT,  # *dtype [B, D, W-1] initial states; unused unless HAS_INIT
    OUT,  # *dtype [B, D, L] output
    FINAL,  # *dtype [B, D, W-1] final states to fill; unused unless HAS_FINAL
    D, L,
    stride_xb, stride_xd, stride_xl,
    stride_wd, stride_ww,
    stride_ib, stride_id, stride_iw,
    stride_ob, stride_od, stride_ol,
    stride_fb, stride_fd, stride_fw,
    W: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    HAS_INIT: tl.constexpr,
    HAS_FINAL: tl.constexpr,
    WIDE: tl.constexpr,  # int64 offsets within a batch row (a row spans 2**31 elements or more)
    BLOCK_D: tl.constexpr,  # channels per program, along the unit stride
    BLOCK_W: tl.constexpr,
):
    # The row's groups of 8 time rows are shared out evenly among the programs along axis 0 (the launcher
    # sizes that axis to cdiv(L, time tile)); a program walks its groups in order, each group 8 coalesced
    # row loads, and keeps the last W-1 rows in registers for the next group: only its first group loads
    # the W-1 rows before it. The taps combine rows held in registers (`column8`).
    pid_l = tl.program_id(0)
    b = tl.program_id(2).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    groups = tl.cdiv(tl.cdiv(L, 8), tl.num_programs(0))  # groups of 8 rows per program
    t_start = pid_l * groups * 8
    if WIDE:
        d, t_start = d.to(tl.int64), t_start.to(tl.int64)
    d_mask = d < D
    x_b = X + b * stride_xb + d * stride_xd
    init_b = INIT + b * stride_ib + d * stride_id
    # the rows before the tile: only the last W-1 are taps
    p1 = _row(x_b, t_start - 7, L, d_mask, init_b, stride_xl, stride_iw, W > 7, HAS_INIT, W)
    p2 = _row(x_b, t_start - 6, L, d_mask, init_b, stride_xl, stride_iw, W > 6, HAS_INIT, W)
    p3 = _row(x_b, t_start - 5, L, d_mask, init_b, stride_xl, stride_iw, W > 5, HAS_INIT, W)
    p4 = _row(x_b, t_start - 4, L, d_mask, init_b, stride_xl, stride_iw, W > 4, HAS_INIT, W)
    p5 = _row(x_b, t_start - 3, L, d_mask, init_b, stride_xl, stride_iw, W > 3, HAS_INIT, W)
    p6 = _row(x_b, t_start - 2, L, d_mask, init_b, stride_xl, stride_iw, W > 2, HAS_INIT, W)
    p7 = _row(x_b, t_start - 1, L, d_mask, init_b, stride_xl, stride_iw, True, HAS_INIT, W)
    p0 = tl.zeros_like(p7)  # 8 rows back: a tap only when W > 8, which takes the generic kernel
    w0 = tap_weight(WEIGHT, d, d_mask, stride_wd, stride_ww, 0, W)
    w1 = tap_weight(WEIGHT, d, d_mask, stride_wd, stride_ww, 1, W)
    w2 = tap_weight(WEIGHT, d, d_mask, stride_wd, stride_ww, 2, W)
    w3 = tap_weight(WEIGHT, d, d_mask, stride_wd, stride_ww, 3, W)
    w4 = tap_weight(WEIGHT, d, d_mask, stride_wd, stride_ww, 4, W)
    w5 = tap_weight(WEIGHT, d, d_mask, stride_wd, stride_ww, 5, W)
    w6 = tap_weight(WEIGHT, d, d_mask, stride_wd, stride_ww, 6, W)
    w7 = tap_weight(WEIGHT, d, d_mask, stride_wd, stride_ww, 7, W)
    bias = 0.0
    if HAS_BIAS:
        bias = tl.load(BIAS + d, mask=d_mask, other=0.0).to(tl.float32)
    o_b = OUT + b * stride_ob + d * stride_od
    n_groups = tl.minimum(groups, tl.cdiv(L - t_start, 8))  # the last program's share may be shorter
    for g in range(n_groups):
        t0 = t_start + g * 8
        e0 = _row(x_b, t0, L, d_mask, init_b, stride_xl, stride_iw, True, False, W)
        e1 = _row(x_b, t0 + 1, L, d_mask, init_b, stride_xl, stride_iw, True, False, W)
        e2 = _row(x_b, t0 + 2, L, d_mask, init_b, stride_xl, stride_iw, True, False, W)
        e3 = _row(x_b, t0 + 3, L, d_mask, init_b, stride_xl, stride_iw, True, False, W)
        e4 = _row(x_b, t0 + 4, L, d_mask, init_b, stride_xl, stride_iw, True, False, W)
        e5 = _row(x_b, t0 + 5, L, d_mask, init_b, stride_xl, stride_iw, True, False, W)
        e6 = _row(x_b, t0 + 6, L, d_mask, init_b, stride_xl, stride_iw, True, False, W)
        e7 = _row(x_b, t0 + 7, L, d_mask, init_b, stride_xl, stride_iw, True, False, W)
        for k in tl.static_range(8):
            acc = column8(k, W, w0, w1, w2, w3, w4, w5, w6, w7, e0, e1, e2, e3, e4, e5, e6, e7,
                          p0, p1, p2, p3, p4, p5, p6, p7)
            _finish_row(acc, bias, o_b, t0 + k, L, d_mask, stride_ol, HAS_BIAS, SILU)
        # the next group's taps before it: carry only the rows a tap reads (the others stay zeros)
        if W > 7:
            p1 = e1
        if W > 6:
            p2 = e2
        if W > 5:
            p3 = e3
        if W > 4:
            p4 = e4
        if W > 3:
            p5 = e5
        if W > 2:
            p6 = e6
        p7 = e7
    if HAS_FINAL:  # noqa: SIM102 (a constexpr gate, then a runtime branch)
        if pid_l == tl.num_programs(0) - 1:
            _store_final_states(x_b[:, None], stride_xl, INIT, 0, INIT + b * stride_ib, stride_id, stride_iw,
                                FINAL + b * stride_fb, stride_fd, stride_fw, d, d_mask, L, W, False, HAS_INIT,
                                BLOCK_W)


def _channel_first_config(block_d: int, block_l: int, warps: int) -> triton.Config:
    return triton.Config({"BLOCK_D": block_d, "BLOCK_L": block_l}, num_warps=warps)


# Large channel-first problems autotune among these once per (D, size class of L); longer rows waste less of
# the misaligned `prev` load's first sector, fewer warps give each thread more loads in flight.
_CHANNEL_FIRST_CANDIDATES = (_channel_first_config(16, 256, 8), _channel_first_config(8, 512, 8),
                             _channel_first_config(4, 1024, 8), _channel_first_config(16, 256, 4))


def _prune_channel_first(configs: list[triton.Config], named_args: dict, **kwargs: object) -> list[triton.Config]:
    """The candidates whose time tile is no longer than the row (at least the shortest)."""
    length = triton.next_power_of_2(named_args["L"])
    fits = [c for c in configs if c.kwargs["BLOCK_L"] <= max(8, length)]
    return fits or [min(configs, key=lambda c: c.kwargs["BLOCK_L"])]


_conv_channel_first_tuned = triton.autotune(
    list(_CHANNEL_FIRST_CANDIDATES), key=["D", "size_class"],
    prune_configs_by={"early_config_prune": _prune_channel_first})(_conv_channel_first_kernel)


@triton.jit(do_not_specialize=["L", "S", "slots"])
def _update_kernel(
    X,  # *dtype [B, D, L] new columns, any strides
    STATE,  # *dtype [slots, D, S] rolling (or circular) state, updated in place
    WEIGHT,  # *float [D, W]
    BIAS,  # *float [D]; unused unless HAS_BIAS
    INDEX,  # *int [B] slot per row, < 0 for padding; unused unless HAS_INDEX
    SEQLENS,  # *int [B] circular write position per row; unused unless CIRCULAR
    OUT,  # *dtype [B, D, L]
    D, L, S, slots,
    stride_xb, stride_xd, stride_xl,
    stride_cs, stride_cd, stride_cl,
    stride_wd, stride_ww,
    stride_ob, stride_od, stride_ol,
    W: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    HAS_INDEX: tl.constexpr,
    CIRCULAR: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = d < D
    if HAS_INDEX:  # noqa: SIM108 (a constexpr branch: the index pointer exists only then)
        slot = tl.load(INDEX + b).to(tl.int64)
    else:
        slot = b
    valid = (slot >= 0) & (slot < slots)
    slot = tl.where(valid, slot, 0)
    x_row = X + b * stride_xb + d[:, None] * stride_xd
    state_row = STATE + slot * stride_cs + d[:, None] * stride_cd
    state_mask = valid & d_mask[:, None]
    pos = 0  # circular: the write position mod S (a C remainder keeps the sign: shift negatives up)
    if CIRCULAR:
        pos = tl.load(SEQLENS + b).to(tl.int64) % S
        pos = tl.where(pos < 0, pos + S, pos)

    # outputs: column q of [state | x] is state column q (q < S) or x column q - S; the circular state's
    # column q is slot column (q + pos) mod S (the W-1 before the write position, for q >= S - (W-1))
    t = tl.arange(0, BLOCK_L)
    t_mask = t < L
    acc = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)
    for j in tl.static_range(W):
        q = S + t - j
        col = q
        if CIRCULAR:
            col = (q + pos) % S
        v_state = tl.load(state_row + col[None, :] * stride_cl, mask=state_mask & ((q < S) & t_mask)[None, :],
                          other=0.0)
        v_x = tl.load(x_row + (q - S)[None, :] * stride_xl, mask=d_mask[:, None] & ((q >= S) & t_mask)[None, :],
                      other=0.0)
        w = tl.load(WEIGHT + d * stride_wd + (W - 1 - j) * stride_ww, mask=d_mask, other=0.0).to(tl.float32)
        acc += w[:, None] * (v_state.to(tl.float32) + v_x.to(tl.float32))
    if HAS_BIAS:
        acc += tl.load(BIAS + d, mask=d_mask, other=0.0).to(tl.float32)[:, None]
    if SILU:
        acc = _silu(acc)
    acc = tl.where(valid, acc, 0.0)
    out_ptrs = OUT + b * stride_ob + d[:, None] * stride_od + t[None, :] * stride_ol
    tl.store(out_ptrs, acc.to(OUT.dtype.element_ty), mask=d_mask[:, None] & t_mask[None, :])

    c = tl.arange(0, BLOCK_S)
    c_mask = state_mask & (c < S)[None, :]
    if CIRCULAR:  # slot column c takes the last new column t with (pos + t) mod S == c, if any
        first = (c - pos + S) % S
        last = first + S * ((L - 1 - first) // S)
        new = tl.load(x_row + last[None, :] * stride_xl, mask=c_mask & (first < L)[None, :], other=0.0)
        tl.debug_barrier()  # every read of the slot above happens before any write below
        tl.store(state_row + c[None, :] * stride_cl, new, mask=c_mask & (first < L)[None, :])
    else:  # new state column c is column L + c of [state | x]: exact copies, no conversion
        src = L + c
        keep = tl.load(state_row + src[None, :] * stride_cl, mask=c_mask & (src < S)[None, :], other=0.0)
        new = tl.load(x_row + (src - S)[None, :] * stride_xl, mask=c_mask & (src >= S)[None, :], other=0.0)
        new = tl.where((src < S)[None, :], keep, new)
        tl.debug_barrier()  # every read of the slot above happens before any write below
        tl.store(state_row + c[None, :] * stride_cl, new, mask=c_mask)


@dataclass(frozen=True)
class ChannelLastTile:
    """The channel-last kernel's work per program: `rows` time rows (a multiple of 8) of `channels` channels
    (a power of 2) with `warps` warps; rows that would leave fewer than `min_programs_per_sm` programs per SM
    are halved (down to 8) first, so short inputs still fill the GPU (0: never). The default is the tile
    measured best on the H200 (benchmarks/gpu_sweep_conv.py: 86% of the copy bandwidth on bf16
    ``[8, 4096, 4096]``, W=4)."""

    rows: int = 128
    channels: int = 512
    warps: int = 4
    min_programs_per_sm: float = 2.0

    def __post_init__(self) -> None:
        if self.rows < 8 or self.rows % 8 or self.channels < 1 or self.channels & (self.channels - 1) or \
                self.warps not in (1, 2, 4, 8, 16) or self.min_programs_per_sm < 0:
            raise ValueError(f"ChannelLastTile: rows a multiple of 8, channels a power of 2, warps 1-16: {self}")


# The tile the launcher uses; benchmarks/gpu_sweep_conv.py assigns other tiles here to time them.
CHANNEL_LAST_TILE = ChannelLastTile()


def channel_last_launch(tile: ChannelLastTile, batch: int, dim: int, length: int,
                        sm_count: int) -> tuple[int, int, int]:
    """(rows, channels, warps) per program for `tile` on a ``[batch, dim, length]`` input: channels at most
    the next power of 2 of `dim` (the warps shrink with them, keeping the tile's channels per thread), rows
    at most the input's and halved while the grid is short."""
    block_d = min(tile.channels, triton.next_power_of_2(dim))
    warps = max(1, tile.warps * block_d // tile.channels)
    rows = min(tile.rows, 8 * triton.cdiv(length, 8))
    columns = batch * triton.cdiv(dim, block_d)
    while rows > 8 and columns * triton.cdiv(length, rows) < tile.min_programs_per_sm * sm_count:
        rows = 8 * triton.cdiv(rows, 16)
    return rows, block_d, warps


@functools.cache
def _sm_count_of(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _sm_count(device: torch.device) -> int:
    """The device's SM count (132 on the H200; a CPU under the interpreter counts as one)."""
    return _sm_count_of(device) if device.type == "cuda" else 1


def _tile(dim: int, other: int, unit_stride_along_d: bool) -> tuple[int, int]:
    """(BLOCK_D, BLOCK_L) of about `_ELEMS_PER_PROGRAM` elements, the long side along the unit stride."""
    if unit_stride_along_d:
        block_d = min(triton.next_power_of_2(dim), 64)
        return block_d, min(triton.next_power_of_2(other), max(1, _ELEMS_PER_PROGRAM // block_d))
    block_l = min(triton.next_power_of_2(other), 256)
    return min(triton.next_power_of_2(dim), max(1, _ELEMS_PER_PROGRAM // block_l)), block_l


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    seq_idx: torch.Tensor | None,
    initial_states: torch.Tensor | None,
    out: torch.Tensor,
    final_states: torch.Tensor | None,
) -> None:
    """Depthwise causal conv1d over ``[B, D, L]`` (causal-conv1d's ``causal_conv1d_fn``), fp32 arithmetic.

    Args:
        x: ``[B, D, L]`` float16/bfloat16/float32, channel-first or a channel-last view.
        weight: ``[D, W]`` float, ``2 <= W <= 16``; bias: ``[D]`` or None.
        activation: None or ``"silu"``.
        seq_idx: int32 ``[B, L]`` or None: taps never cross a change of id; ids < 0 output 0.
        initial_states: ``[B, D, W-1]`` or None (zeros).
        out: ``[B, D, L]`` to fill, any strides.
        final_states: ``[B, D, W-1]`` to fill with the last ``W-1`` inputs (exact copies), or None.
    """
    batch, dim, length = x.shape
    width = weight.shape[1]
    if batch == 0 or dim == 0 or length == 0:
        return
    channel_last = x.stride(1) == 1 and x.stride(2) != 1
    block_d, block_l = _tile(dim, length, channel_last)
    dummy = out
    init = initial_states if initial_states is not None else dummy
    final = final_states if final_states is not None else dummy
    span = max(1 + (dim - 1) * abs(t.stride(1)) + (length - 1) * abs(t.stride(2)) for t in (x, out))
    flags = {"W": width, "HAS_BIAS": bias is not None, "SILU": activation == "silu",
             "HAS_INIT": initial_states is not None, "HAS_FINAL": final_states is not None, "WIDE": span >= 2**31}
    common = (*weight.stride(), *(init.stride() if initial_states is not None else (0, 0, 0)), *out.stride())
    final_strides = final.stride() if final_states is not None else (0, 0, 0)
    blocks = {"BLOCK_D": block_d, "BLOCK_L": max(8, block_l), "BLOCK_W": triton.next_power_of_2(width - 1),
              "num_warps": 8 if block_d * block_l >= 4096 else 4}
    grid = (triton.cdiv(length, blocks["BLOCK_L"]), triton.cdiv(dim, block_d), batch)
    bias_arg = bias if bias is not None else weight
    if channel_last and seq_idx is None and width <= _FAST_MAX_WIDTH:
        rows, block_d, warps = channel_last_launch(CHANNEL_LAST_TILE, batch, dim, length, _sm_count(x.device))
        _conv_channel_last_kernel[(triton.cdiv(length, rows), triton.cdiv(dim, block_d), batch)](
            x, weight, bias_arg, init, out, final, dim, length, *x.stride(), *common, *final_strides, **flags,
            BLOCK_D=block_d, BLOCK_W=blocks["BLOCK_W"], num_warps=warps,
        )
        return
    if not channel_last and seq_idx is None and width <= _FAST_MAX_WIDTH:
        args = (x, weight, bias_arg, init, out, final, dim, length, length.bit_length(), *x.stride(), *common,
                *final_strides)
        if x.numel() >= TUNE_MIN_NUMEL and os.environ.get("TRITON_INTERPRET") != "1":
            _conv_channel_first_tuned[lambda meta: (triton.cdiv(length, meta["BLOCK_L"]),
                                                    triton.cdiv(dim, meta["BLOCK_D"]), batch)](
                *args, **flags, BLOCK_W=blocks["BLOCK_W"])
        else:
            _conv_channel_first_kernel[grid](*args, **flags, **blocks)
        return
    seq = seq_idx if seq_idx is not None else dummy
    seq_strides = seq.stride()[:2] if seq_idx is not None else (0, 0)
    kernel = _conv_kernel_unit_l if x.stride(2) == 1 else _conv_kernel
    kernel[grid](
        x, weight, bias_arg, seq, init, out, final, dim, length, *x.stride(), *common[:2], *seq_strides,
        *common[2:], *final_strides, HAS_SEQ=seq_idx is not None, **flags, **blocks,
    )


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    conv_state_indices: torch.Tensor | None,
    out: torch.Tensor,
    cache_seqlens: torch.Tensor | None = None,
) -> None:
    """Decode step(s) against a rolling state, or a circular one with `cache_seqlens` (causal-conv1d's
    ``causal_conv1d_update``), fp32 arithmetic.

    Args:
        x: ``[B, D, L]`` float16/bfloat16/float32, any strides.
        conv_state: ``[slots, D, S]``, ``W-1 <= S <= MAX_STATE_LEN``, updated in place (exact copies).
        weight: ``[D, W]``; bias: ``[D]`` or None; activation: None or ``"silu"``.
        conv_state_indices: int32/int64 ``[B]`` or None (row b uses slot b); negative or ``>= slots``
            (unchecked mode): output 0, state untouched.
        out: ``[B, D, L]`` to fill.
        cache_seqlens: int ``[B]`` or None: the circular state's write position per row (taken mod S).

    Raises:
        ValueError: ``S > MAX_STATE_LEN`` (the capability gates it first).
    """
    batch, dim, length = x.shape
    slots, _, state_len = conv_state.shape
    if state_len > MAX_STATE_LEN:
        raise ValueError(f"triton causal_conv1d_update: state length {state_len} > {MAX_STATE_LEN}")
    if batch == 0 or dim == 0 or length == 0:
        return
    block_l = triton.next_power_of_2(length)
    block_s = triton.next_power_of_2(state_len)
    block_d = min(triton.next_power_of_2(dim), max(16, _ELEMS_PER_PROGRAM // max(block_l, block_s)))
    index = conv_state_indices.contiguous() if conv_state_indices is not None else out  # read with unit stride
    seqlens = cache_seqlens.contiguous() if cache_seqlens is not None else out
    _update_kernel[(batch, triton.cdiv(dim, block_d))](
        x, conv_state, weight, bias if bias is not None else weight, index, seqlens, out, dim, length, state_len,
        slots, *x.stride(), *conv_state.stride(), *weight.stride(), *out.stride(),
        W=weight.shape[1], HAS_BIAS=bias is not None, SILU=activation == "silu",
        HAS_INDEX=conv_state_indices is not None, CIRCULAR=cache_seqlens is not None, BLOCK_D=block_d,
        BLOCK_L=block_l, BLOCK_S=block_s, num_warps=4,
    )


_DTYPES = OneOf("dtype", ("float16", "bfloat16", "float32"))
_WIDTH = Between("width", MIN_WIDTH, MAX_WIDTH)

IMPLEMENTATIONS = [
    Implementation("causal_conv1d", "triton", "triton.causal_conv1d",
                   Capability(*base_constraints(), _DTYPES, _WIDTH,
                              OneOf("varlen", (False,), fix="use the torch provider for vLLM's packed form "
                                                            "(query_start_loc): not written in Triton yet")),
                   PRIORITY, causal_conv1d),
    Implementation("causal_conv1d_update", "triton", "triton.causal_conv1d_update",
                   Capability(*base_constraints(), _DTYPES, _WIDTH,
                              Between("state_len", 1, MAX_STATE_LEN, fix="use the torch provider")),
                   PRIORITY, causal_conv1d_update),
]

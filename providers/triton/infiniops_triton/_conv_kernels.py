"""Triton kernels of causal_conv1d and its decode step; the launchers and their tiles are in `causal_conv1d`.

Three prefill kernels: `_conv_kernel` / `_conv_kernel_unit_l` (the generic one, any layout, with
``seq_idx``; compiled once per layout), `_conv_channel_first_kernel` (channel-first without ``seq_idx``,
taps picked from registers by `_conv_taps`) and `_conv_channel_last_kernel` (channel-last without
``seq_idx``, 8 rows at a time held in registers); and the decode step `_update_kernel` (a rolling or
circular state, updated in place). What each computes and why is told in `causal_conv1d`'s docstring.
"""

from __future__ import annotations

import triton
import triton.language as tl

from infiniops_triton._conv_taps import column8, conv_taps8, tap_weight

__all__ = ["_conv_channel_first_kernel", "_conv_channel_last_kernel", "_conv_kernel", "_conv_kernel_unit_l",
           "_update_kernel"]


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

"""Register taps for the channel-first causal_conv1d kernel: a depthwise convolution along the unit-stride
axis of a ``[BLOCK_D, BLOCK_L]`` tile, without shifted (misaligned) loads.

Each thread holds groups of 8 consecutive columns (one 16-byte vector in 16-bit dtypes). Splitting a tile
into its 8 column classes (``8m + k``) is register renaming, so the value ``j`` columns back is column
``k - j`` of the same group or, below 0, column ``k - j + 8`` of the previous group: the caller loads the
tile and the tile 8 columns earlier (both aligned), and `conv_taps8` does the rest in registers.

The channel-last kernel uses the same arithmetic on rows: `column8` combines eight consecutive time rows
(``e``) and the eight before them (``p``), each a ``[BLOCK_D]`` vector loaded once.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["column8", "conv_taps8", "tap_weight"]


@triton.jit
def _split8(x, BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr):
    """``[BLOCK_D, BLOCK_L]`` -> the eight ``[BLOCK_D, BLOCK_L // 8]`` tensors of columns ``8m + k``, k = 0..7
    (each thread holds 8 consecutive columns: register renaming, no data movement)."""
    x = tl.reshape(x, (BLOCK_D, BLOCK_L // 8, 2, 2, 2))  # column 8m + 4a + 2b + c at [m, a, b, c]
    c0, c1 = tl.split(x)
    c0b0, c0b1 = tl.split(c0)
    c1b0, c1b1 = tl.split(c1)
    e0, e4 = tl.split(c0b0)
    e2, e6 = tl.split(c0b1)
    e1, e5 = tl.split(c1b0)
    e3, e7 = tl.split(c1b1)
    return e0, e1, e2, e3, e4, e5, e6, e7


@triton.jit
def _join8(o0, o1, o2, o3, o4, o5, o6, o7, BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr):
    """The inverse of `_split8`."""
    c0 = tl.join(tl.join(o0, o4), tl.join(o2, o6))
    c1 = tl.join(tl.join(o1, o5), tl.join(o3, o7))
    return tl.reshape(tl.join(c0, c1), (BLOCK_D, BLOCK_L))


@triton.jit
def _pick8(i: tl.constexpr, v0, v1, v2, v3, v4, v5, v6, v7):
    if i == 0:  # noqa: SIM116 (Triton code has no dicts; the constexpr chain folds away)
        return v0
    elif i == 1:
        return v1
    elif i == 2:
        return v2
    elif i == 3:
        return v3
    elif i == 4:
        return v4
    elif i == 5:
        return v5
    elif i == 6:
        return v6
    else:
        return v7


@triton.jit
def column8(k: tl.constexpr, W: tl.constexpr, w0, w1, w2, w3, w4, w5, w6, w7,
             e0, e1, e2, e3, e4, e5, e6, e7, p0, p1, p2, p3, p4, p5, p6, p7):
    """Output column ``8m + k``: the taps ``j`` back are column ``k - j`` of this group of 8 (``e``) or,
    below 0, of the previous group (``p``)."""
    acc = tl.zeros_like(e0)
    for j in tl.static_range(W):
        if k - j >= 0:
            v = _pick8(k - j, e0, e1, e2, e3, e4, e5, e6, e7)
        else:
            v = _pick8(k - j + 8, p0, p1, p2, p3, p4, p5, p6, p7)
        acc += _pick8(W - 1 - j, w0, w1, w2, w3, w4, w5, w6, w7) * v
    return acc


@triton.jit
def tap_weight(WEIGHT, d, d_mask, stride_wd, stride_ww, k: tl.constexpr, W: tl.constexpr):
    """Tap k of every channel `d` as a ``[BLOCK_D]`` fp32 vector (zeros past the width)."""
    if k >= W:
        return tl.zeros(d.shape, dtype=tl.float32)
    return tl.load(WEIGHT + d * stride_wd + k * stride_ww, mask=d_mask, other=0.0).to(tl.float32)


@triton.jit
def conv_taps8(
    cur,  # fp32 [BLOCK_D, BLOCK_L]: x at columns t
    prev,  # fp32 [BLOCK_D, BLOCK_L]: x at columns t - 8 (zeros, or initial states, before column 0)
    WEIGHT,  # *float [D, W] taps, the last one multiplies column t
    d, d_mask, stride_wd, stride_ww,
    W: tl.constexpr,  # <= 8
    BLOCK_D: tl.constexpr,
    BLOCK_L: tl.constexpr,  # a multiple of 8
):
    """``sum_j WEIGHT[d, W-1-j] * x[d, t-j]`` over the tile, fp32 ``[BLOCK_D, BLOCK_L]``."""
    e0, e1, e2, e3, e4, e5, e6, e7 = _split8(cur, BLOCK_D, BLOCK_L)
    p0, p1, p2, p3, p4, p5, p6, p7 = _split8(prev, BLOCK_D, BLOCK_L)
    w0 = tap_weight(WEIGHT, d, d_mask, stride_wd, stride_ww, 0, W)[:, None]
    w1 = tap_weight(WEIGHT, d, d_mask, stride_wd, stride_ww, 1, W)[:, None]
    w2 = tap_weight(WEIGHT, d, d_mask, stride_wd, stride_ww, 2, W)[:, None]
    w3 = tap_weight(WEIGHT, d, d_mask, stride_wd, stride_ww, 3, W)[:, None]
    w4 = tap_weight(WEIGHT, d, d_mask, stride_wd, stride_ww, 4, W)[:, None]
    w5 = tap_weight(WEIGHT, d, d_mask, stride_wd, stride_ww, 5, W)[:, None]
    w6 = tap_weight(WEIGHT, d, d_mask, stride_wd, stride_ww, 6, W)[:, None]
    w7 = tap_weight(WEIGHT, d, d_mask, stride_wd, stride_ww, 7, W)[:, None]
    o0 = column8(0, W, w0, w1, w2, w3, w4, w5, w6, w7, e0, e1, e2, e3, e4, e5, e6, e7, p0, p1, p2, p3, p4, p5, p6, p7)
    o1 = column8(1, W, w0, w1, w2, w3, w4, w5, w6, w7, e0, e1, e2, e3, e4, e5, e6, e7, p0, p1, p2, p3, p4, p5, p6, p7)
    o2 = column8(2, W, w0, w1, w2, w3, w4, w5, w6, w7, e0, e1, e2, e3, e4, e5, e6, e7, p0, p1, p2, p3, p4, p5, p6, p7)
    o3 = column8(3, W, w0, w1, w2, w3, w4, w5, w6, w7, e0, e1, e2, e3, e4, e5, e6, e7, p0, p1, p2, p3, p4, p5, p6, p7)
    o4 = column8(4, W, w0, w1, w2, w3, w4, w5, w6, w7, e0, e1, e2, e3, e4, e5, e6, e7, p0, p1, p2, p3, p4, p5, p6, p7)
    o5 = column8(5, W, w0, w1, w2, w3, w4, w5, w6, w7, e0, e1, e2, e3, e4, e5, e6, e7, p0, p1, p2, p3, p4, p5, p6, p7)
    o6 = column8(6, W, w0, w1, w2, w3, w4, w5, w6, w7, e0, e1, e2, e3, e4, e5, e6, e7, p0, p1, p2, p3, p4, p5, p6, p7)
    o7 = column8(7, W, w0, w1, w2, w3, w4, w5, w6, w7, e0, e1, e2, e3, e4, e5, e6, e7, p0, p1, p2, p3, p4, p5, p6, p7)
    return _join8(o0, o1, o2, o3, o4, o5, o6, o7, BLOCK_D, BLOCK_L)

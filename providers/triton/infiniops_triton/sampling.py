"""Sampling as one Triton kernel: a program per output row, the row streamed in blocks, no sort.

A program reads its logits row once (penalties applied on the fly), writes the penalized float32 row to a
workspace and keeps its max, argmax and non-finite flag. A greedy row (temperature <= 0) stores the argmax.
Otherwise the thresholds are exact 15-fold searches over the order-preserving integer key of ``z = (x - max) /
T`` (``key = bits(-z)``, 0 for the maxima, larger for less likely tokens), each pass testing 16 candidate keys
at once: the top-k key is the smallest key with at least k tokens at or below it (8 passes at most), the top-p
key the largest key whose strictly more likely tokens hold less than top_p of the mass kept by min-p and top-k
(one pass for the mass, 8 more). The draw is Gumbel-max with
``tl.philox`` keyed by the row's seed, counter ``(token, offset)``: the same uniforms as the contract's
`philox_uniform`, so the torch provider and this one draw the same tokens wherever their float32 filters agree.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infiniops_py import Capability, Implementation, OneOf
from infiniops_py.operators.sampling import Penalties
from infiniops_triton._common import base_constraints
from infiniops_triton._fastlaunch import Launcher

__all__ = ["IMPLEMENTATIONS", "top_k_top_p_sampling_from_logits"]

_BLOCK = 1024
_WAYS = 16  # candidate keys per search pass, both ends included: the interval of keys shrinks 15-fold per pass
_SEARCH = 128  # columns per step of a search pass ([WAYS, SEARCH] comparisons in registers)
_ITERS = 8  # search passes over keys in [0, 2**31): 15**8 > 2**31, exact; 0x7F800000 (in the kernel): key of -inf


@triton.jit
def _z_key(w, m, temp):
    z = (w - m) / temp
    return tl.where(z == 0.0, 0, (-z).to(tl.int32, bitcast=True)), z


@triton.jit
def _counts_le(W, V, m, temp, cand, SEARCH: tl.constexpr):
    """For each candidate key ``cand[j]``: how many tokens have a key <= it."""
    total = tl.zeros(cand.shape, tl.int32)
    for start in range(0, V, SEARCH):
        cols = start + tl.arange(0, SEARCH)
        w = tl.load(W + cols, mask=cols < V, other=float("-inf"))
        key, _ = _z_key(w, m, temp)
        hit = (key[None, :] <= cand[:, None]) & (cols < V)[None, :]
        total += tl.sum(hit.to(tl.int32), 1)
    return total


@triton.jit
def _masses_lt(W, V, m, temp, cand, kept, SEARCH: tl.constexpr):
    """For each candidate key ``cand[j]``: the sum of exp(z) over the tokens with key < it among key <= kept."""
    total = tl.zeros(cand.shape, tl.float32)
    for start in range(0, V, SEARCH):
        cols = start + tl.arange(0, SEARCH)
        w = tl.load(W + cols, mask=cols < V, other=float("-inf"))
        key, z = _z_key(w, m, temp)
        weight = tl.where((key <= kept) & (cols < V), tl.exp(z), 0.0)
        total += tl.sum(tl.where(key[None, :] < cand[:, None], weight[None, :], 0.0), 1)
    return total


@triton.jit
def _candidates(lo, hi, WAYS: tl.constexpr):
    """``WAYS`` nondecreasing keys from `lo` to `hi`, evenly spread (int64 arithmetic: no overflow)."""
    j = tl.arange(0, WAYS).to(tl.int64)
    span = (hi - lo).to(tl.int64)
    return (lo.to(tl.int64) + (j * span) // (WAYS - 1)).to(tl.int32)


@triton.jit
def _narrow(lo, hi, cand, good, WAYS: tl.constexpr):
    """The next ``[lo, hi]``: up to the first candidate where `good` holds (it holds at `hi`)."""
    j = tl.arange(0, WAYS)
    first = tl.min(tl.where(good, j, WAYS), 0)
    new_hi = tl.sum(tl.where(j == first, cand, 0), 0)
    below = tl.sum(tl.where(j == first - 1, cand, 0), 0) + 1
    return tl.where(first == 0, lo, below), new_hi


@triton.jit
def _sample_kernel(
    LOGITS, stride_l, ROWS, TOPK, TOPP, TEMP, MINP, SEED, OFFSET,
    REP, FREQ, PRES, COUNTS, stride_c, SEEN, stride_s,
    WORK, OUT, V,
    PENALIZED: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr, WAYS: tl.constexpr,
    SEARCH: tl.constexpr,
):
    b = tl.program_id(0)
    r = tl.load(ROWS + b)
    W = WORK + b.to(tl.int64) * V
    zero = b * 0  # int32 scalars, so every branch and loop carries one type
    m = zero.to(tl.float32) - float("inf")
    arg = zero
    bad = zero
    finite = zero
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < V
        x = tl.load(LOGITS + r * stride_l + cols, mask=inside, other=float("-inf")).to(tl.float32)
        if PENALIZED:
            seen = tl.load(SEEN + r * stride_s + cols, mask=inside, other=0) != 0
            count = tl.load(COUNTS + r * stride_c + cols, mask=inside, other=0).to(tl.float32)
            rep = tl.load(REP + r).to(tl.float32)
            x = tl.where(seen, tl.where(x > 0, x / rep, x * rep), x)
            x = x - tl.load(FREQ + r).to(tl.float32) * count - tl.load(PRES + r).to(tl.float32) * (count > 0)
        bad = tl.maximum(bad, tl.max(((x != x) | (x == float("inf"))).to(tl.int32), 0))
        finite = tl.maximum(finite, tl.max((x > float("-inf")).to(tl.int32), 0))
        block_max = tl.max(x, 0)
        block_arg = tl.argmax(x, 0)
        arg = tl.where(block_max > m, start + block_arg, arg)
        m = tl.maximum(m, block_max)
        tl.store(W + cols, x, mask=inside)
    temp = tl.load(TEMP + b).to(tl.float32)
    result = arg
    if (bad == 0) & (finite != 0) & (temp > 0):
        temp = tl.maximum(temp, 1.1754943508222875e-38)
        min_p = tl.load(MINP + b).to(tl.float32)
        kept = zero + 0x7F800000
        if min_p > 0:
            floor = tl.maximum(-tl.log(min_p), 0.0)  # min_p > 1 keeps the maxima
            kept = tl.where(floor == 0.0, 0, floor.to(tl.int32, bitcast=True))
        k = tl.load(TOPK + b)
        if (k > 0) & (k < V):  # the smallest key with at least k tokens at or below it
            lo = zero
            hi = zero + 0x7F800000
            for _ in range(ITERS):
                if lo < hi:
                    cand = _candidates(lo, hi, WAYS)
                    lo, hi = _narrow(lo, hi, cand, _counts_le(W, V, m, temp, cand, SEARCH) >= k, WAYS)
            kept = tl.minimum(kept, hi)
        top_p = tl.load(TOPP + b).to(tl.float32)
        if top_p < 1:  # the largest key whose strictly more likely tokens hold less than top_p of the mass
            lo = zero
            hi = kept + 1
            need = top_p * tl.max(_masses_lt(W, V, m, temp, hi + tl.zeros((WAYS,), tl.int32), kept, SEARCH), 0)
            for _ in range(ITERS):
                if lo < hi:
                    cand = _candidates(lo, hi, WAYS)
                    lo, hi = _narrow(lo, hi, cand, _masses_lt(W, V, m, temp, cand, kept, SEARCH) >= need, WAYS)
            kept = tl.maximum(tl.minimum(kept, hi - 1), 0)
        seed = tl.load(SEED + b)
        offset = tl.load(OFFSET + b)
        off_lo = (offset & 0xFFFFFFFF).to(tl.uint32)
        off_hi = ((offset >> 32) & 0xFFFFFFFF).to(tl.uint32)
        best = m * 0 - float("inf")
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            w = tl.load(W + cols, mask=cols < V, other=float("-inf"))
            key, z = _z_key(w, m, temp)
            c = cols.to(tl.uint32)
            c0, _, _, _ = tl.philox(seed, c, c * 0 + off_lo, c * 0 + off_hi, c * 0)
            u = ((c0 >> 8).to(tl.float32) + 0.5) * 5.9604644775390625e-08
            score = tl.where((key <= kept) & (cols < V), z - tl.log(-tl.log(u)), float("-inf"))
            block_best = tl.max(score, 0)
            result = tl.where(block_best > best, start + tl.argmax(score, 0), result)
            best = tl.maximum(best, block_best)
    result = tl.where((bad != 0) | (finite == 0), -1, result)
    tl.store(OUT + b, result.to(tl.int32))


_SAMPLE = Launcher(_sample_kernel)


def top_k_top_p_sampling_from_logits(logits: torch.Tensor, rows: torch.Tensor, top_k: torch.Tensor,
                                     top_p: torch.Tensor, temperature: torch.Tensor, min_p: torch.Tensor,
                                     seed: torch.Tensor, offset: torch.Tensor, penalties: Penalties | None,
                                     out: torch.Tensor) -> torch.Tensor:
    """`out` ``[N]`` int32 (see the operator module's calling convention); one program per output row."""
    n, v = out.shape[0], logits.shape[1]
    work = torch.empty((n, v), dtype=torch.float32, device=logits.device)
    if penalties is None:
        rep = freq = pres = counts = seen = logits  # never read
        stride_c = stride_s = 0
    else:
        rep, freq, pres, counts, seen = penalties
        counts, seen = counts.contiguous(), seen.contiguous().view(torch.uint8)
        stride_c, stride_s = counts.stride(0), seen.stride(0)
    _SAMPLE((n,),
        logits, logits.stride(0), rows, top_k, top_p, temperature, min_p, seed, offset,
        rep, freq, pres, counts, stride_c, seen, stride_s, work, out, v,
        PENALIZED=penalties is not None, BLOCK=min(_BLOCK, triton.next_power_of_2(v)), ITERS=_ITERS, WAYS=_WAYS,
        SEARCH=_SEARCH, num_warps=4,
    )
    return out


# Below the torch provider's 10: one program per row makes this kernel slower than the torch provider's batched
# pipeline at every batch measured on the H200 (benchmarks/RESULTS.md, "Sampling"), so it serves by measured time
# (`infiniops tune`) or when asked for, not by default.
SAMPLING_PRIORITY = 5


IMPLEMENTATIONS = [
    Implementation(
        "top_k_top_p_sampling_from_logits", "triton", "triton.top_k_top_p_sampling_from_logits",
        Capability(*base_constraints(), OneOf("dtype", ("float16", "bfloat16", "float32")),
                   OneOf("penalized", (False, True))),
        SAMPLING_PRIORITY, top_k_top_p_sampling_from_logits,
    ),
]

"""Sampling as one Triton kernel: each output row split over programs (up to two per SM in all), no sort.

Step 0: each program reads its chunk of the logits row once (penalties applied on the fly and the penalized
float32 chunk kept in a workspace) and keeps its max, first argmax, non-finite flags and the max of each
256-column group. A greedy row (temperature <= 0) takes the argmax. Otherwise the thresholds are exact 15-fold
searches over the order-preserving integer key of ``z = (x - max) / T`` (``key = bits(-z)``, 0 for the maxima,
larger for less likely tokens), each level testing 16 candidate keys at once: the top-k key is the smallest key
with at least k tokens at or below it (8 levels), the top-p key the largest key whose strictly more likely
tokens hold less than top_p of the mass kept by min-p and top-k (8 levels; the first one's last candidate gives
that mass). The draw is Gumbel-max with ``tl.philox`` keyed by the row's seed, counter ``(token, offset)``: the
same uniforms as the contract's `philox_uniform`, so the torch provider and this one draw the same tokens
wherever their float32 filters agree.

A top-k no larger than the row's group count (the chat case: k of 20-100 against 594 groups of Qwen's
vocabulary) is compacted first (step 1): the k-th largest group max bounds the k-th largest logit from below,
so the tokens at or above it (usually little more than k; at most ``256 k`` without ties) hold every token
top-k can keep; each program appends its chunk's (an atomic count gives the places), and when they fit the
list (`_CAP`) the first program alone runs both searches and the draw over them, the masses summed in fixed
point so that the list's order (the atomics') cannot change a sum. Other rows search all their columns, each
level over every chunk, the row's programs summing their partial counts or masses, then draw per chunk and
over the chunks. A compacted row costs two passes over its logits instead of seventeen.

On a GPU the steps run in one launch, the programs of a row meeting at a barrier (an atomic counter) between
steps; the launch has at most two programs per SM (four warps each), so a row's programs are resident
together. Splitting a row over many programs is what makes a single row fast (a row streamed by one program is
latency-bound); one launch is what keeps the host's cost at one kernel, and the per-row tiles are as wide at
every batch size, so three compiled kernels (one row, a multiple of 16 rows, other) serve every batch (the
engine's warm-up compiles them). The interpreter runs programs one after another, so
there a row is one program; a row split over programs there (the tests) runs each step as its own launch,
replaying the earlier levels' narrowing from their partials.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from infiniops_py import Capability, Implementation, OneOf
from infiniops_py.operators.sampling import Penalties
from infiniops_triton._common import PRIORITY, base_constraints, cdiv, next_power_of_2, sm_count
from infiniops_triton._fastlaunch import Launcher

__all__ = ["IMPLEMENTATIONS", "launch", "split", "top_k_top_p_sampling_from_logits"]

_BLOCK = 1024
_WAYS = 16  # candidate keys per search pass, both ends included: the interval of keys shrinks 15-fold per pass
_SEARCH = 256  # columns per step of a search pass ([WAYS, SEARCH] partial sums in registers)
_WARPS = 4
_PER_SM = 2  # programs an SM holds at once: 4 warps of up to 255 registers a thread each, in 64K registers
_ITERS = 8  # search passes over keys in [0, 2**31): 15**8 > 2**31, exact; 0x7F800000 (in the kernel): key of -inf


@triton.jit
def _z_key(w, m, temp):
    z = (w - m) / temp
    return tl.where(z == 0.0, 0, (-z).to(tl.int32, bitcast=True)), z


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
def _barrier(CNT, b, target):
    """Wait until the `target`-th arrival at row `b`'s counter (this program's included): the programs of a row
    are resident together (the launch has at most `_PER_SM` per SM), so the spin ends."""
    tl.debug_barrier()  # every thread's stores happen before the arrival is released
    tl.atomic_add(CNT + b, 1, sem="release")
    seen = tl.atomic_add(CNT + b, 0, sem="acquire")
    while seen < target:
        seen = tl.atomic_add(CNT + b, 0, sem="acquire")
    tl.debug_barrier()  # and every thread's loads after the arrivals are acquired


@triton.jit
def _chunk_counts(SRC, col0, col1, m, temp, cand, SEARCH: tl.constexpr, CACHE: tl.constexpr):
    """For each candidate key ``cand[j]``: how many tokens of columns [col0, col1) have a key <= it (per-thread
    sums of [WAYS, SEARCH] in registers, reduced once; the next block's load issued before this one's sums)."""
    total = tl.zeros((cand.shape[0], SEARCH), tl.float32)
    cols = col0 + tl.arange(0, SEARCH)
    w = tl.load(SRC + cols, mask=cols < col1, other=float("-inf"), cache_modifier=CACHE).to(tl.float32)
    for start in range(col0, col1, SEARCH):
        inside = cols < col1
        key, _ = _z_key(w, m, temp)
        cols = start + SEARCH + tl.arange(0, SEARCH)
        w = tl.load(SRC + cols, mask=cols < col1, other=float("-inf"), cache_modifier=CACHE).to(tl.float32)
        total += ((key[None, :] <= cand[:, None]) & inside[None, :]).to(tl.float32)
    return tl.sum(total, 1)


@triton.jit
def _chunk_masses(SRC, col0, col1, m, temp, cand, kept, SEARCH: tl.constexpr):
    """For each candidate key ``cand[j]``: the sum of exp(z) over the tokens of [col0, col1) with key < it among
    key <= kept (summed like `_chunk_counts`)."""
    total = tl.zeros((cand.shape[0], SEARCH), tl.float32)
    cols = col0 + tl.arange(0, SEARCH)
    w = tl.load(SRC + cols, mask=cols < col1, other=float("-inf")).to(tl.float32)
    for start in range(col0, col1, SEARCH):
        inside = cols < col1
        key, z = _z_key(w, m, temp)
        weight = tl.where((key <= kept) & inside, tl.exp(z), 0.0)
        cols = start + SEARCH + tl.arange(0, SEARCH)
        w = tl.load(SRC + cols, mask=cols < col1, other=float("-inf")).to(tl.float32)
        total += tl.where(key[None, :] < cand[:, None], weight[None, :], 0.0)
    return tl.sum(total, 1)


@triton.jit
def _dense_masses(DW, total, m, temp, cand, kept, SEARCH: tl.constexpr):
    """`_chunk_masses` over the `total` compacted logits at `DW`, summed in 40-bit fixed point (int64): the
    compaction's order is the atomics' order, and integer sums do not depend on it."""
    acc = tl.zeros((cand.shape[0],), tl.int64)
    for start in range(0, total, SEARCH):
        idx = start + tl.arange(0, SEARCH)
        inside = idx < total
        w = tl.load(DW + idx, mask=inside, other=float("-inf"), cache_modifier=".cg")
        key, z = _z_key(w, m, temp)
        weight = tl.where((key <= kept) & inside, tl.exp(z) * 1099511627776.0, 0.0).to(tl.int64)
        acc += tl.sum(tl.where(key[None, :] < cand[:, None], weight[None, :], 0), 1)
    return acc.to(tl.float32) * 9.094947017729282e-13


@triton.jit
def _dense_search(DW, total, m, temp, k, top_p, kept, do_p, ITERS: tl.constexpr, WAYS: tl.constexpr,
                  SEARCH: tl.constexpr):
    """Both searches by one program over the `total` compacted logits at `DW` (every token the top-k key can
    keep is there, so counts at candidates up to it are exact and above it at least k): the kept key."""
    lo = total * 0
    hi = lo + 0x7F800000
    for _ in range(0, ITERS):
        if lo < hi:
            cand = _candidates(lo, hi, WAYS)
            part = _chunk_counts(DW, 0, total, m, temp, cand, SEARCH, ".cg")
            lo, hi = _narrow(lo, hi, cand, part >= k.to(tl.float32), WAYS)
    kept = tl.minimum(kept, hi)
    lo = total * 0
    hi = kept + 1
    need = m * 0
    for level in range(0, ITERS):
        if do_p & (lo < hi):
            cand = _candidates(lo, hi, WAYS)
            part = _dense_masses(DW, total, m, temp, cand, kept, SEARCH)
            if level == 0:
                need = top_p * tl.max(tl.where(tl.arange(0, WAYS) == WAYS - 1, part, 0.0), 0)
            lo, hi = _narrow(lo, hi, cand, part >= need, WAYS)
    return tl.where(do_p, tl.maximum(tl.minimum(kept, hi - 1), 0), kept)


@triton.jit
def _uniform(seed, cols, off_lo, off_hi):
    """The contract's `philox_uniform` of columns `cols` (int32) of a row: Philox-4x32 keyed by the seed, counter
    ``(column, offset low, offset high, 0)``, the first word's top 24 bits, centred in (0, 1)."""
    u32 = cols.to(tl.uint32)
    c0, _, _, _ = tl.philox(seed, u32, u32 * 0 + off_lo, u32 * 0 + off_hi, u32 * 0)
    return ((c0 >> 8).to(tl.float32) + 0.5) * 5.9604644775390625e-08


# Arguments that change with the batch size (the programs per row, the places of the per-row options and of
# the workspace's parts in their buffers) are not specialized: each "equal to 1" or "divisible by 16" change
# would be a compile in the middle of serving. The logits, their row stride, V and CHUNK decide the vector loads
# and are; so is the row count N (unspecialized, the penalized kernel spills), whose three classes (1, a multiple
# of 16, other) the engine's warm-up compiles.
_UNSPECIALIZED = ("ROWS", "TOPK", "TOPP", "TEMP", "MINP", "SEED", "OFFSET", "REP", "FREQ", "PRES", "SMAX", "SARG",
                  "SFLAG", "PART", "DBEST", "DIDX", "GMAX", "DW", "DI", "CNT", "OUT", "P", "NG", "FIRST", "LAST")


@triton.jit(do_not_specialize=_UNSPECIALIZED)
def _sample_kernel(
    LOGITS, stride_l, ROWS, TOPK, TOPP, TEMP, MINP, SEED, OFFSET,
    REP, FREQ, PRES, COUNTS, stride_c, SEEN, stride_s,
    WORK, SMAX, SARG, SFLAG, PART, DBEST, DIDX, GMAX, DW, DI, CNT, OUT, N, V, P, CHUNK, NG, FIRST, LAST,
    PENALIZED: tl.constexpr, BLOCK: tl.constexpr, GROUP: tl.constexpr, NGP: tl.constexpr, CAP: tl.constexpr,
    ITERS: tl.constexpr, WAYS: tl.constexpr, SEARCH: tl.constexpr, PP: tl.constexpr,
):
    """Program (b, c): chunk c of output row b, steps FIRST..LAST (0: row statistics and group maxima, 1: the
    top-k candidates' compaction, 2..2*ITERS+1: the search levels, 2*ITERS+2: the chunk's draw, 2*ITERS+3: the
    row's draw by chunk 0; a compacted row is searched and drawn by chunk 0 alone at step 2), with a barrier of
    the row's P programs between steps; a launch of one step replays the earlier levels from their partials."""
    b = tl.program_id(0)
    c = tl.program_id(1)
    r = tl.load(ROWS + b)
    col0 = c * CHUNK
    col1 = tl.minimum(col0 + CHUNK, V)
    if PENALIZED:  # noqa: SIM108 (a constexpr branch: each side has its own pointer type)
        SRC = WORK + b.to(tl.int64) * V
    else:
        SRC = LOGITS + r * stride_l
    zero = b * 0  # int32 scalars, so every branch and loop carries one type
    crossed = zero
    me = b * P + c
    if FIRST == 0:  # step 0: the chunk's max, first argmax, flags and group maxima (penalties applied, stored)
        cmax = zero.to(tl.float32) - float("inf")
        carg = col0
        bad = zero
        finite = zero
        groups = tl.arange(0, BLOCK // GROUP)
        for start in range(col0, col1, BLOCK):
            cols = start + groups[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
            inside = cols < col1
            x = tl.load(LOGITS + r * stride_l + cols, mask=inside, other=float("-inf")).to(tl.float32)
            if PENALIZED:
                seen = tl.load(SEEN + r * stride_s + cols, mask=inside, other=0) != 0
                count = tl.load(COUNTS + r * stride_c + cols, mask=inside, other=0).to(tl.float32)
                rep = tl.load(REP + r).to(tl.float32)
                x = tl.where(seen, tl.where(x > 0, x / rep, x * rep), x)
                x = x - tl.load(FREQ + r).to(tl.float32) * count - tl.load(PRES + r).to(tl.float32) * (count > 0)
                tl.store(SRC + cols, x, mask=inside)
            bad = tl.maximum(bad, tl.max(tl.max(((x != x) | (x == float("inf"))).to(tl.int32), 1), 0))
            finite = tl.maximum(finite, tl.max(tl.max((x > float("-inf")).to(tl.int32), 1), 0))
            gmax = tl.max(x, 1)
            tl.store(GMAX + b.to(tl.int64) * NG + start // GROUP + groups, gmax,
                     mask=start + groups * GROUP < col1)
            block_max = tl.max(gmax, 0)
            block_arg = tl.min(tl.min(tl.where(x == block_max, cols, V), 1), 0)
            carg = tl.where(block_max > cmax, block_arg, carg)
            cmax = tl.maximum(cmax, block_max)
        tl.store(SMAX + me, cmax)
        tl.store(SARG + me, carg)
        tl.store(SFLAG + me, bad * 2 + finite)
        if LAST > 0:
            crossed += 1
            _barrier(CNT, b, P * crossed)
    # the row: max, first argmax, flags, options
    chunks = tl.arange(0, PP)
    present = chunks < P
    smax = tl.load(SMAX + b * P + chunks, mask=present, other=float("-inf"), cache_modifier=".cg")
    sarg = tl.load(SARG + b * P + chunks, mask=present, other=0, cache_modifier=".cg")
    sflag = tl.load(SFLAG + b * P + chunks, mask=present, other=0, cache_modifier=".cg")
    m = tl.max(smax, 0)
    arg = tl.min(tl.where(present & (smax == m), sarg, V), 0)
    bad = tl.max(sflag // 2, 0)
    finite = tl.max(sflag % 2, 0)
    temp = tl.load(TEMP + b).to(tl.float32)
    active = (bad == 0) & (finite != 0) & (temp > 0)
    temp = tl.maximum(temp, 1.1754943508222875e-38)
    min_p = tl.load(MINP + b).to(tl.float32)
    kept = zero + 0x7F800000
    if min_p > 0:
        floor = tl.maximum(-tl.log(min_p), 0.0)  # min_p > 1 keeps the maxima
        kept = tl.where(floor == 0.0, 0, floor.to(tl.int32, bitcast=True))
    k = tl.load(TOPK + b)
    do_k = active & (k > 0) & (k < V)
    top_p = tl.load(TOPP + b).to(tl.float32)
    do_p = active & (top_p < 1)
    # step 1: a top-k of at most NG keeps only tokens at or above the k-th largest group max; each program
    # appends its chunk's such tokens (value and column) to the row's compacted list (at most CAP of them)
    compacting = do_k & (k <= NG) & (NGP > 1)
    if NGP > 1:  # noqa: SIM102 (a constexpr branch: a one-wide sort does not compile)
        if compacting & (FIRST <= 1) & (LAST >= 1):
            g = tl.arange(0, NGP)
            row_gmax = tl.load(GMAX + b.to(tl.int64) * NG + g, mask=g < NG, other=float("-inf"),
                               cache_modifier=".cg")
            kth = tl.max(tl.where(g == k - 1, tl.sort(row_gmax, descending=True), float("-inf")), 0)
            bound = _z_key(kth, m, temp)[0]
            for start in range(col0, col1, SEARCH):
                cols = start + tl.arange(0, SEARCH)
                inside = cols < col1
                w = tl.load(SRC + cols, mask=inside, other=float("-inf")).to(tl.float32)
                key = _z_key(w, m, temp)[0]
                chosen = ((key <= bound) & inside).to(tl.int32)
                picked = tl.sum(chosen, 0)
                if picked > 0:
                    at = tl.atomic_add(CNT + N + b, picked, sem="relaxed") + tl.cumsum(chosen, 0) - 1
                    ok = (chosen != 0) & (at < CAP)
                    tl.store(DW + b.to(tl.int64) * CAP + at, w, mask=ok)
                    tl.store(DI + b.to(tl.int64) * CAP + at, cols, mask=ok)
            if LAST > 1:
                crossed += 1
                _barrier(CNT, b, P * crossed)
    total = tl.load(CNT + N + b, cache_modifier=".cg")
    compact = compacting & (total <= CAP)
    seed = tl.load(SEED + b)
    offset = tl.load(OFFSET + b)
    off_lo = (offset & 0xFFFFFFFF).to(tl.uint32)
    off_hi = ((offset >> 32) & 0xFFFFFFFF).to(tl.uint32)
    if compact:  # chunk 0 alone: both searches and the draw over the compacted tokens
        if (c == 0) & (FIRST <= 2) & (LAST >= 2):
            dw = DW + b.to(tl.int64) * CAP
            di = DI + b.to(tl.int64) * CAP
            kept = _dense_search(dw, total, m, temp, k, top_p, kept, do_p, ITERS, WAYS, SEARCH)
            best = m * 0 - float("inf")
            best_at = zero + V
            for start in range(0, total, SEARCH):
                idx = start + tl.arange(0, SEARCH)
                inside = idx < total
                w = tl.load(dw + idx, mask=inside, other=float("-inf"), cache_modifier=".cg")
                cols = tl.load(di + idx, mask=inside, other=V, cache_modifier=".cg")
                key, z = _z_key(w, m, temp)
                score = tl.where((key <= kept) & inside, z - tl.log(-tl.log(_uniform(seed, cols, off_lo, off_hi))),
                                 float("-inf"))
                block_best = tl.max(score, 0)
                block_at = tl.min(tl.where(score == block_best, cols, V), 0)
                best_at = tl.where(block_best > best, block_at,
                                   tl.where(block_best == best, tl.minimum(best_at, block_at), best_at))
                best = tl.maximum(best, block_best)
            tl.store(OUT + b, best_at.to(tl.int32))
    else:
        # the search: levels 0..ITERS-1 the top-k key (the smallest key with at least k tokens at or below it),
        # levels ITERS..2*ITERS-1 the top-p key (the largest key whose strictly more likely tokens hold less than
        # top_p of the mass kept so far); level ITERS's last candidate is kept + 1, whose mass is that mass
        lo = zero
        hi = zero + 0x7F800000
        need = m * 0
        j = tl.arange(0, WAYS)
        for level in range(0, 2 * ITERS):
            counting = level < ITERS
            if level == ITERS:
                kept = tl.where(do_k, tl.minimum(kept, hi), kept)
                lo = zero
                hi = kept + 1
            searching = tl.where(counting, do_k, do_p) & (lo < hi)
            cand = _candidates(lo, hi, WAYS)
            step = level + 2
            if (step >= FIRST) & (step <= LAST):
                if searching:
                    if counting:
                        part = _chunk_counts(SRC, col0, col1, m, temp, cand, SEARCH, "")
                    else:
                        part = _chunk_masses(SRC, col0, col1, m, temp, cand, kept, SEARCH)
                    tl.store(PART + ((level * N + b) * P + c) * WAYS + j, part)
                if step < LAST:
                    crossed += 1
                    _barrier(CNT, b, P * crossed)
            if (step < LAST) & searching:  # later steps of this launch need the narrowed interval
                part = tl.sum(tl.load(PART + ((level * N + b) * P + chunks[:, None]) * WAYS + j[None, :],
                                      mask=present[:, None], other=0.0, cache_modifier=".cg"), 0)
                if level == ITERS:
                    need = top_p * tl.max(tl.where(j == WAYS - 1, part, 0.0), 0)
                good = tl.where(counting, part >= k.to(tl.float32), part >= need)
                lo, hi = _narrow(lo, hi, cand, good, WAYS)
        kept = tl.where(do_p, tl.maximum(tl.minimum(kept, hi - 1), 0), kept)
        draw = 2 * ITERS + 2
        if (draw >= FIRST) & (draw <= LAST):  # the chunk's Gumbel-max over its kept tokens
            best = m * 0 - float("inf")
            best_at = col0
            if active:
                for start in range(col0, col1, BLOCK):
                    cols = start + tl.arange(0, BLOCK)
                    inside = cols < col1
                    w = tl.load(SRC + cols, mask=inside, other=float("-inf")).to(tl.float32)
                    key, z = _z_key(w, m, temp)
                    score = tl.where((key <= kept) & inside,
                                     z - tl.log(-tl.log(_uniform(seed, cols, off_lo, off_hi))), float("-inf"))
                    block_best = tl.max(score, 0)
                    best_at = tl.where(block_best > best, start + tl.argmax(score, 0), best_at)
                    best = tl.maximum(best, block_best)
            tl.store(DBEST + me, best)
            tl.store(DIDX + me, best_at)
            if draw < LAST:
                crossed += 1
                _barrier(CNT, b, P * crossed)
        if (draw + 1 <= LAST) & (c == 0):  # the row's draw: the best chunk (the first on ties)
            result = arg
            if active:
                dbest = tl.load(DBEST + b * P + chunks, mask=present, other=float("-inf"), cache_modifier=".cg")
                didx = tl.load(DIDX + b * P + chunks, mask=present, other=V, cache_modifier=".cg")
                top = tl.max(dbest, 0)
                result = tl.min(tl.where(present & (dbest == top), didx, V), 0)
            result = tl.where((bad != 0) | (finite == 0), -1, result)
            tl.store(OUT + b, result.to(tl.int32))


_SAMPLE = Launcher(_sample_kernel)
_STEPS = 2 * _ITERS + 4  # statistics, the compaction, the search levels, the chunks' draws, the rows' draws
_MIN_CHUNK = 1024  # columns per program at least
_MAX_SPLIT = 128  # programs per row at most: the per-row tiles are this wide on a GPU whatever the batch
_GROUP = 256  # columns per group maximum (the compaction's bound); a multiple of _SEARCH divides every chunk
_MAX_GROUPS = 1024  # groups a row may have for the compaction (the sort's width): vocabularies up to 262144
_CAP = 4096  # compacted tokens a row may have; more and the row is searched over all its columns
_INTERPRETER_SMS = 0  # under the interpreter a row is one program (tests split it on purpose)


def split(n: int, v: int, device: torch.device) -> tuple[int, int]:
    """``(P, CHUNK)``: the programs per output row and the columns per program, at most `_PER_SM` programs per
    SM in all (so a row's programs are resident together and its barriers cannot deadlock)."""
    sms = sm_count(device) if device.type == "cuda" else _INTERPRETER_SMS
    p = max(1, min(_PER_SM * sms // n, cdiv(v, _MIN_CHUNK), _MAX_SPLIT))  # 1 under the interpreter
    chunk = cdiv(cdiv(v, p), _SEARCH) * _SEARCH
    return cdiv(v, chunk), chunk


def top_k_top_p_sampling_from_logits(logits: torch.Tensor, rows: torch.Tensor, top_k: torch.Tensor,
                                     top_p: torch.Tensor, temperature: torch.Tensor, min_p: torch.Tensor,
                                     seed: torch.Tensor, offset: torch.Tensor, penalties: Penalties | None,
                                     out: torch.Tensor) -> torch.Tensor:
    """`out` ``[N]`` int32 (see the operator module's calling convention); P programs per output row."""
    return launch(logits, rows, top_k, top_p, temperature, min_p, seed, offset, penalties, out)


def launch(logits: torch.Tensor, rows: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           temperature: torch.Tensor, min_p: torch.Tensor, seed: torch.Tensor, offset: torch.Tensor,
           penalties: Penalties | None, out: torch.Tensor, *, chunks: tuple[int, int] | None = None,
           one_launch: bool | None = None, counters: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel on `chunks` ``(P, CHUNK)`` (default `split`), as one launch with barriers (default on a GPU)
    or one launch per step (the interpreter's way, which runs programs one after another). `counters`, a zeroed
    int32 ``[2N]`` (default a fresh one), receives each row's barrier arrivals, then its compacted token count
    (0 where the row was not compacted; above `_CAP` where it was searched over all its columns)."""
    n, v = out.shape[0], logits.shape[1]
    dev = logits.device
    p, chunk = chunks or split(n, v, dev)
    if one_launch is None:  # the interpreter runs one launch only where a row has one program
        one_launch = dev.type == "cuda" or p == 1
    if one_launch and dev.type == "cuda" and n * p > _PER_SM * sm_count(dev) and p > 1:
        raise ValueError(f"{n} rows x {p} programs exceed the SMs: the barriers could deadlock")
    groups = cdiv(v, _GROUP)
    stats = n * p * (5 + 2 * _ITERS * _WAYS)
    ws = torch.empty(stats + n * groups + 2 * n * _CAP, dtype=torch.int32, device=dev)
    smax, sarg, sflag, dbest, didx = (ws[i * n * p:(i + 1) * n * p] for i in range(5))
    smax, dbest = smax.view(torch.float32), dbest.view(torch.float32)
    part = ws[5 * n * p:stats].view(torch.float32)
    gmax = ws[stats:stats + n * groups].view(torch.float32)
    dw = ws[stats + n * groups:stats + n * groups + n * _CAP].view(torch.float32)
    di = ws[stats + n * groups + n * _CAP:]
    cnt = torch.zeros(2 * n, dtype=torch.int32, device=dev) if counters is None else counters
    if penalties is None:
        rep = freq = pres = counts = seen = work = logits  # never read
        stride_c = stride_s = 0
    else:
        rep, freq, pres, counts, seen = penalties
        counts, seen = counts.contiguous(), seen.contiguous().view(torch.uint8)
        stride_c, stride_s = counts.stride(0), seen.stride(0)
        work = torch.empty((n, v), dtype=torch.float32, device=dev)
    # the tiles over a row's programs are as wide on a GPU at every batch size: one compiled kernel
    pp = max(next_power_of_2(p), _MAX_SPLIT if dev.type == "cuda" else 1)
    ngp = next_power_of_2(groups) if groups <= _MAX_GROUPS else 1  # 1: no compaction
    steps = [(0, _STEPS - 1)] if one_launch else [(s, s) for s in range(_STEPS)]
    for first, last in steps:
        _SAMPLE((n, p),
            logits, logits.stride(0), rows, top_k, top_p, temperature, min_p, seed, offset,
            rep, freq, pres, counts, stride_c, seen, stride_s, work, smax, sarg, sflag, part, dbest, didx,
            gmax, dw, di, cnt, out, n, v, p, chunk, groups, first, last,
            PENALIZED=penalties is not None, BLOCK=_BLOCK, GROUP=_GROUP, NGP=ngp, CAP=_CAP, ITERS=_ITERS,
            WAYS=_WAYS, SEARCH=_SEARCH, PP=pp, num_warps=_WARPS,
        )
    return out


SAMPLING_PRIORITY = PRIORITY  # benchmarks/gpu_sampling.py compares it with the torch provider


IMPLEMENTATIONS = [
    Implementation(
        "top_k_top_p_sampling_from_logits", "triton", "triton.top_k_top_p_sampling_from_logits",
        Capability(*base_constraints(), OneOf("dtype", ("float16", "bfloat16", "float32")),
                   OneOf("penalized", (False, True))),
        SAMPLING_PRIORITY, top_k_top_p_sampling_from_logits,
    ),
]

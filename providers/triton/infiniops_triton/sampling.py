"""Sampling as one Triton kernel: each output row split over programs (up to two per SM in all), no sort.

Step 0: each program reads its chunk of the logits row once (penalties applied on the fly and the penalized
float32 chunk kept in a workspace) and keeps its max, first argmax and non-finite flags. A greedy row
(temperature <= 0) takes the argmax. Otherwise the thresholds are exact 15-fold searches over the
order-preserving integer key of ``z = (x - max) / T`` (``key = bits(-z)``, 0 for the maxima, larger for less
likely tokens), each level testing 16 candidate keys at once over every chunk, the row's programs summing their
partial counts or masses: the top-k key is the smallest key with at least k tokens at or below it (8 levels),
the top-p key the largest key whose strictly more likely tokens hold less than top_p of the mass kept by min-p
and top-k (8 levels; the first one's last candidate gives that mass). The draw is Gumbel-max with ``tl.philox``
keyed by the row's seed, counter ``(token, offset)``, per chunk, then over the chunks: the same uniforms as the
contract's `philox_uniform`, so the torch provider and this one draw the same tokens wherever their float32
filters agree.

On a GPU the steps run in one launch, the programs of a row meeting at a barrier (an atomic counter) between
steps; the launch has at most two programs per SM (four warps each), so a row's programs are resident
together. Splitting a row over many programs is what makes a single row fast (a row streamed by one program is
latency-bound); one launch is what keeps the host's cost at one kernel. The interpreter runs programs one after
another, so there a row is one program; a row split over programs there (the tests) runs each step as its own
launch, replaying the earlier levels' narrowing from their partials.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from infiniops_py import Capability, Implementation, OneOf
from infiniops_py.operators.sampling import Penalties
from infiniops_triton._common import PRIORITY, base_constraints, sm_count
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
def _chunk_counts(SRC, col0, col1, m, temp, cand, SEARCH: tl.constexpr):
    """For each candidate key ``cand[j]``: how many tokens of columns [col0, col1) have a key <= it (per-thread
    sums of [WAYS, SEARCH] in registers, reduced once; the next block's load issued before this one's sums)."""
    total = tl.zeros((cand.shape[0], SEARCH), tl.float32)
    cols = col0 + tl.arange(0, SEARCH)
    w = tl.load(SRC + cols, mask=cols < col1, other=float("-inf")).to(tl.float32)
    for start in range(col0, col1, SEARCH):
        inside = cols < col1
        key, _ = _z_key(w, m, temp)
        cols = start + SEARCH + tl.arange(0, SEARCH)
        w = tl.load(SRC + cols, mask=cols < col1, other=float("-inf")).to(tl.float32)
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
def _sample_kernel(
    LOGITS, stride_l, ROWS, TOPK, TOPP, TEMP, MINP, SEED, OFFSET,
    REP, FREQ, PRES, COUNTS, stride_c, SEEN, stride_s,
    WORK, SMAX, SARG, SFLAG, PART, DBEST, DIDX, CNT, OUT, N, V, P, CHUNK, FIRST, LAST,
    PENALIZED: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr, WAYS: tl.constexpr,
    SEARCH: tl.constexpr, PP: tl.constexpr,
):
    """Program (b, c): chunk c of output row b, steps FIRST..LAST (0: row statistics, 1..2*ITERS: the search
    levels, 2*ITERS+1: the chunk's draw, 2*ITERS+2: the row's draw by chunk 0), with a barrier of the row's P
    programs between steps; a launch of one step replays the earlier levels' narrowing from their partials."""
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
    if FIRST == 0:  # step 0: the chunk's max, first argmax and flags (penalties applied, stored when penalized)
        cmax = zero.to(tl.float32) - float("inf")
        carg = col0
        bad = zero
        finite = zero
        for start in range(col0, col1, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < col1
            x = tl.load(LOGITS + r * stride_l + cols, mask=inside, other=float("-inf")).to(tl.float32)
            if PENALIZED:
                seen = tl.load(SEEN + r * stride_s + cols, mask=inside, other=0) != 0
                count = tl.load(COUNTS + r * stride_c + cols, mask=inside, other=0).to(tl.float32)
                rep = tl.load(REP + r).to(tl.float32)
                x = tl.where(seen, tl.where(x > 0, x / rep, x * rep), x)
                x = x - tl.load(FREQ + r).to(tl.float32) * count - tl.load(PRES + r).to(tl.float32) * (count > 0)
                tl.store(SRC + cols, x, mask=inside)
            bad = tl.maximum(bad, tl.max(((x != x) | (x == float("inf"))).to(tl.int32), 0))
            finite = tl.maximum(finite, tl.max((x > float("-inf")).to(tl.int32), 0))
            block_max = tl.max(x, 0)
            block_arg = tl.argmax(x, 0)
            carg = tl.where(block_max > cmax, start + block_arg, carg)
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
        step = level + 1
        if (step >= FIRST) & (step <= LAST):
            if searching:
                if counting:
                    part = _chunk_counts(SRC, col0, col1, m, temp, cand, SEARCH)
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
    draw = 2 * ITERS + 1
    if (draw >= FIRST) & (draw <= LAST):  # the chunk's Gumbel-max over its kept tokens
        seed = tl.load(SEED + b)
        offset = tl.load(OFFSET + b)
        off_lo = (offset & 0xFFFFFFFF).to(tl.uint32)
        off_hi = ((offset >> 32) & 0xFFFFFFFF).to(tl.uint32)
        best = m * 0 - float("inf")
        best_at = col0
        if active:
            for start in range(col0, col1, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                inside = cols < col1
                w = tl.load(SRC + cols, mask=inside, other=float("-inf")).to(tl.float32)
                key, z = _z_key(w, m, temp)
                u32 = cols.to(tl.uint32)
                c0, _, _, _ = tl.philox(seed, u32, u32 * 0 + off_lo, u32 * 0 + off_hi, u32 * 0)
                u = ((c0 >> 8).to(tl.float32) + 0.5) * 5.9604644775390625e-08
                score = tl.where((key <= kept) & inside, z - tl.log(-tl.log(u)), float("-inf"))
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
_STEPS = 2 * _ITERS + 3  # statistics, the search levels, the chunks' draws, the rows' draws
_MIN_CHUNK = 1024  # columns per program at least
_INTERPRETER_SMS = 0  # under the interpreter a row is one program (tests split it on purpose)


def split(n: int, v: int, device: torch.device) -> tuple[int, int]:
    """``(P, CHUNK)``: the programs per output row and the columns per program, at most `_PER_SM` programs per
    SM in all (so a row's programs are resident together and its barriers cannot deadlock)."""
    sms = sm_count(device) if device.type == "cuda" else _INTERPRETER_SMS
    p = max(1, min(_PER_SM * sms // n, triton.cdiv(v, _MIN_CHUNK)))  # 1 under the interpreter
    chunk = triton.cdiv(triton.cdiv(v, p), _SEARCH) * _SEARCH
    return triton.cdiv(v, chunk), chunk


def top_k_top_p_sampling_from_logits(logits: torch.Tensor, rows: torch.Tensor, top_k: torch.Tensor,
                                     top_p: torch.Tensor, temperature: torch.Tensor, min_p: torch.Tensor,
                                     seed: torch.Tensor, offset: torch.Tensor, penalties: Penalties | None,
                                     out: torch.Tensor) -> torch.Tensor:
    """`out` ``[N]`` int32 (see the operator module's calling convention); P programs per output row."""
    return launch(logits, rows, top_k, top_p, temperature, min_p, seed, offset, penalties, out)


def launch(logits: torch.Tensor, rows: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           temperature: torch.Tensor, min_p: torch.Tensor, seed: torch.Tensor, offset: torch.Tensor,
           penalties: Penalties | None, out: torch.Tensor, *, chunks: tuple[int, int] | None = None,
           one_launch: bool | None = None) -> torch.Tensor:
    """The kernel on `chunks` ``(P, CHUNK)`` (default `split`), as one launch with barriers (default on a GPU)
    or one launch per step (the interpreter's way, which runs programs one after another)."""
    n, v = out.shape[0], logits.shape[1]
    dev = logits.device
    p, chunk = chunks or split(n, v, dev)
    if one_launch is None:  # the interpreter runs one launch only where a row has one program
        one_launch = dev.type == "cuda" or p == 1
    if one_launch and dev.type == "cuda" and n * p > _PER_SM * sm_count(dev) and p > 1:
        raise ValueError(f"{n} rows x {p} programs exceed the SMs: the barriers could deadlock")
    ws = torch.empty(n * p * (5 + 2 * _ITERS * _WAYS), dtype=torch.int32, device=dev)
    smax, sarg, sflag, dbest, didx = (ws[i * n * p:(i + 1) * n * p] for i in range(5))
    smax, dbest = smax.view(torch.float32), dbest.view(torch.float32)
    part = ws[5 * n * p:].view(torch.float32)
    cnt = torch.zeros(n, dtype=torch.int32, device=dev)
    if penalties is None:
        rep = freq = pres = counts = seen = work = logits  # never read
        stride_c = stride_s = 0
    else:
        rep, freq, pres, counts, seen = penalties
        counts, seen = counts.contiguous(), seen.contiguous().view(torch.uint8)
        stride_c, stride_s = counts.stride(0), seen.stride(0)
        work = torch.empty((n, v), dtype=torch.float32, device=dev)
    steps = [(0, _STEPS - 1)] if one_launch else [(s, s) for s in range(_STEPS)]
    for first, last in steps:
        _SAMPLE((n, p),
            logits, logits.stride(0), rows, top_k, top_p, temperature, min_p, seed, offset,
            rep, freq, pres, counts, stride_c, seen, stride_s, work, smax, sarg, sflag, part, dbest, didx, cnt,
            out, n, v, p, chunk, first, last,
            PENALIZED=penalties is not None, BLOCK=min(_BLOCK, triton.next_power_of_2(chunk)), ITERS=_ITERS,
            WAYS=_WAYS, SEARCH=_SEARCH, PP=triton.next_power_of_2(p), num_warps=_WARPS,
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

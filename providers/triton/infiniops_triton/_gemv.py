"""The decode Gemm: ``out = alpha * x @ w.T + beta * c + bias`` for a few rows of x and an ``nn.Linear`` weight.

A decode step multiplies one to sixty-four token rows by each projection weight: the work is one pass over the
weight ``w`` ``[N, K]`` (unit K stride), and the time is the time that pass takes. The tiled kernel
(`infiniops_triton.gemm`) spends it on 64-row tiles of which one row is real; this kernel instead gives each
program ``BLOCK_N`` rows of ``w`` (output columns) and streams that ``[BLOCK_N, K]`` panel in ``BLOCK_K`` steps
of contiguous 16-byte loads, so that many programs keep many loads in flight; every row of x is in the one
``BLOCK_M`` tile, so the weight is read once. The rows of ``x`` (``M * K`` elements, in L2 after the first
program) are re-read by every program. One row (``BLOCK_M == 1``) multiplies elementwise in fp32 registers and
sums over K once after the loop (or after each step: ``SUM_EACH``), its loop optionally pipelined through shared
memory (``PIPE`` stages) or unrolled (``UNROLL``); 2 to 64 rows use ``tl.dot`` on a 16-, 32- or 64-row tile
(fp32 accumulation, software-pipelined ``num_stages`` deep). ``EVICT`` loads the weight ``evict_first`` (it is read
once per step). A weight of few panels (N the hidden size, K the intermediate size) also splits its K range over
``SPLIT_K`` programs: each stores its fp32 partial, counts itself done on the tile's counter (after a barrier,
acquire-release), and the last one sums the partials and runs the epilogue, so the product stays one kernel. The
epilogue is the tiled kernel's: `alpha`, ``beta * c`` (read only when ``HAS_C``), the bias, one rounding to the
output dtype; or SiLU-and-multiply of the gate and up halves (``SWIGLU``, `infiniops_triton.gemm_swiglu`); or the
residual add and the row's RMSNorm (``ADD_NORM``, `infiniops_triton.gemm_add_rms_norm`): each program adds its
columns of the product into the residual, counts itself done on one more counter (as the splits do), and the last
column tile to finish normalizes the whole rows, so the product, the add and the norm stay one kernel. ``PRE_NORM``
(`infiniops_triton.rms_norm_gemm`) is a prologue instead: each program (each split too) first reads its rows of x
once for their mean square over K, then normalizes every x tile as it loads it (`rms_norm`'s roundings), so the
norm before a projection costs one more read of the rows and no launch, and no program waits on another.

The configuration (a `Variant`) comes from `TABLE` per ``(row class, N, K, swiglu)`` where the GPU sweep
(`benchmarks/gpu_sweep_gemv.py`) filled it; elsewhere it is autotuned once per ``(N, K, row class)`` (1 to 16
rows; a model has a handful of projection shapes), and 17 to 64 rows are left to the tiled kernel.
"""
from __future__ import annotations

import functools
import json
import os
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from infiniops_triton._common import cdiv, next_power_of_2, pdl, pdl_start
from infiniops_triton._fastlaunch import Launcher
from infiniops_triton._launch import Tuned

__all__ = ["MAX_ROWS", "TABLE", "TABLE_ROWS", "Variant", "gemv", "launch", "load_table", "row_class", "serves",
           "takes"]

MAX_ROWS = 16  # the rows of x this kernel takes; more go to the tiled kernel unless `TABLE` names the shape
TABLE_ROWS = 64  # the most rows a `TABLE` entry takes


class Variant(NamedTuple):
    """One configuration of the kernel: the column tile `block_n`, the K step `block_k`, the programs `split_k`
    sharing a column tile's K range, `warps` and `stages` (Triton's ``num_warps``/``num_stages``: the 16-to-64-row
    loop's software pipelining), and the knobs of the weight loads and the one-row loop: `evict` (the weight
    loaded ``evict_first``: it is read once; Triton 3.6 emits the hint only on loads straight to registers, not on
    the cp.async copies of the tiles or of ``pipe > 1``), `pipe` (the one-row loop as ``tl.range(num_stages=pipe)``: the
    weight staged through shared memory `pipe` deep; 1: loaded straight to registers), `unroll` (its
    ``loop_unroll_factor``), and `sum_each` (the one-row products summed over each K step instead of once after
    the loop: fewer registers for wide steps)."""

    block_n: int
    block_k: int
    split_k: int = 1
    warps: int = 4
    stages: int = 3
    evict: bool = False
    pipe: int = 1
    unroll: int = 1
    sum_each: bool = False

    def config(self) -> triton.Config:
        """The `triton.Config` of this variant."""
        return triton.Config({"BLOCK_N": self.block_n, "BLOCK_K": self.block_k, "SPLIT_K": self.split_k,
                              "EVICT": "evict_first" if self.evict else "", "PIPE": self.pipe,
                              "UNROLL": self.unroll, "SUM_EACH": self.sum_each},
                             num_warps=self.warps, num_stages=self.stages)


_V = Variant
# One row: narrow panels, the K range split in up to 4 (the N = hidden-size projections have few panels). The first
# eight are the autotuner's candidates; the rest try the knobs: no split with narrow panels over wide K steps, the
# loop pipelined through shared memory or unrolled, evict-first weight loads, per-step sums.
SWEEP_ONE_ROW = (
    _V(8, 256, 1, 4, 4), _V(16, 256, 1, 4, 3), _V(16, 512, 1, 8, 3), _V(8, 256, 2, 4, 4), _V(16, 256, 2, 4, 3),
    _V(16, 256, 4, 4, 3), _V(32, 256, 4, 8, 3), _V(8, 512, 4, 4, 3),
    _V(4, 1024, 1, 4), _V(4, 1024, 1, 4, evict=True), _V(2, 1024, 1, 2), _V(8, 512, 1, 4),
    _V(8, 512, 1, 4, evict=True), _V(8, 1024, 1, 4, sum_each=True), _V(16, 1024, 1, 8, sum_each=True),
    _V(2, 2048, 1, 4, sum_each=True), _V(8, 256, 1, 4, pipe=3), _V(4, 512, 1, 4, pipe=3),
    _V(8, 512, 1, 4, pipe=3, evict=True), _V(8, 256, 1, 4, unroll=4), _V(4, 512, 2, 4), _V(8, 512, 2, 4),
    _V(4, 1024, 2, 4, evict=True), _V(8, 512, 4, 4, evict=True),
)
# 16 to 64 rows on tensor cores (tl.dot needs N >= 16); the first seven are the autotuner's (at 16 rows).
SWEEP_TILE = (
    _V(16, 128, 1, 4, 4), _V(32, 128, 1, 4, 4), _V(64, 128, 1, 4, 3), _V(16, 128, 2, 4, 4), _V(32, 128, 2, 4, 4),
    _V(16, 256, 4, 4, 3), _V(32, 128, 4, 4, 3),
    _V(16, 256, 1, 4, 3), _V(32, 256, 1, 4, 3), _V(64, 64, 1, 4, 4), _V(16, 128, 1, 4, 4, evict=True),
    _V(32, 128, 2, 4, 4, evict=True), _V(16, 128, 4, 4, 4), _V(64, 128, 2, 4, 3),
)
_ONE_ROW = tuple(v.config() for v in SWEEP_ONE_ROW[:8])
_FEW_ROWS = tuple(v.config() for v in SWEEP_TILE[:7])
_INTERPRETER = (_V(16, 32, 2, 4, 1).config(),)
MAX_SPLIT_K = 4  # of the autotuned candidates
ROW_CLASSES = (1, 16, 32, 64)  # BLOCK_M: one row, then a tl.dot tile of 16, 32 or 64 rows

# The variant per (row class, output columns N, K, swiglu), as `benchmarks/gpu_sweep_gemv.py --only qwen3 --only
# mamba2 --emit` measured them on the H200 (the winners by 2% or more over the autotuned default, each checked
# against float64; benchmarks/RESULTS.md, session 10); a shape not here is autotuned among `_ONE_ROW` /
# `_FEW_ROWS` (1 to 16 rows) or left to the tiled kernel (17 to 64 rows). ``INFINIOPS_GEMV_TABLE=FILE`` (the
# sweep's ``--emit`` JSON) adds to it at import.
TABLE: dict[tuple[int, int, int, bool], Variant] = {
    # Qwen3-0.6B qkv [1024 -> 4096]
    (1, 4096, 1024, False): _V(4, 1024, evict=True),
    (16, 4096, 1024, False): _V(32, 128, 1, 4, 4),
    (32, 4096, 1024, False): _V(32, 256),
    (64, 4096, 1024, False): _V(32, 128, 1, 4, 4),
    # Qwen3-0.6B o [2048 -> 1024]
    (1, 1024, 2048, False): _V(2, 2048, sum_each=True),
    (16, 1024, 2048, False): _V(32, 128, 4),
    (32, 1024, 2048, False): _V(16, 128, 4, 4, 4),
    (64, 1024, 2048, False): _V(32, 128, 4),
    # Qwen3-0.6B gate_up [1024 -> 6144]
    (1, 6144, 1024, False): _V(8, 512, evict=True),
    (32, 6144, 1024, False): _V(32, 128, 1, 4, 4),
    (64, 6144, 1024, False): _V(64, 128),
    # Qwen3-0.6B down [3072 -> 1024]
    (1, 1024, 3072, False): _V(4, 1024, evict=True),
    (32, 1024, 3072, False): _V(16, 128, 4, 4, 4),
    (64, 1024, 3072, False): _V(32, 128, 4),
    # Mamba-2-130m in_proj [768 -> 3352]
    (1, 3352, 768, False): _V(4, 1024, evict=True),
    (32, 3352, 768, False): _V(32, 128, 1, 4, 4),
    (64, 3352, 768, False): _V(32, 128, 1, 4, 4),
    # Mamba-2-130m out_proj [1536 -> 768]
    (1, 768, 1536, False): _V(2, 2048, sum_each=True),
    (16, 768, 1536, False): _V(32, 128, 4),
    (32, 768, 1536, False): _V(32, 128, 4),
    (64, 768, 1536, False): _V(16, 128, 1, 4, 4),
    # Qwen3-0.6B gate_up + SwiGLU [1024 -> 6144]
    (1, 3072, 1024, True): _V(8, 256, pipe=3),
    (32, 3072, 1024, True): _V(32, 128, 1, 4, 4),
    (64, 3072, 1024, True): _V(32, 128, 1, 4, 4),
}


def row_class(m: int) -> int:
    """The kernel's ``BLOCK_M`` for `m` rows of x (1 <= m <= 64): 1, 16, 32 or 64."""
    return 1 if m == 1 else 16 if m <= 16 else 32 if m <= 32 else 64


def load_table(path: str) -> dict[tuple[int, int, int, bool], Variant]:
    """The entries of a table file: a JSON list of ``{"rows": row class, "n": N, "k": K, "swiglu": bool,
    "variant": [Variant fields in order]}``. Raises ValueError naming the file and the entry when one is not, or
    names a row class other than 1, 16, 32, 64, a split below 1, a K step below 16, or (past one row) a column tile
    below 16."""
    with open(path) as f:
        entries = json.load(f)
    table = {}
    for i, e in enumerate(entries if isinstance(entries, list) else [entries]):
        try:
            key = (int(e["rows"]), int(e["n"]), int(e["k"]), bool(e["swiglu"]))
            variant = Variant(*e["variant"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path}: entry {i} is not a GEMV table entry: {e!r} ({err})") from None
        if key[0] not in ROW_CLASSES or variant.split_k < 1 or variant.block_k < 16 or variant.block_n < (
                1 if key[0] == 1 else 16):  # tl.dot takes N >= 16
            raise ValueError(f"{path}: entry {i}: row class {key[0]} or variant {variant} out of range")
        table[key] = variant
    return table


if _TABLE_FILE := os.environ.get("INFINIOPS_GEMV_TABLE"):
    TABLE.update(load_table(_TABLE_FILE))


def _configs() -> list[triton.Config]:
    if os.environ.get("TRITON_INTERPRET") == "1":  # one config: the interpreter must not autotune
        return list(_INTERPRETER)
    return [*_ONE_ROW, *_FEW_ROWS]


def _prune(configs: list[triton.Config], named_args: dict, **kwargs: object) -> list[triton.Config]:
    """The row class's candidates (all of them under the interpreter's single config)."""
    if len(configs) == 1:
        return configs
    return list(_ONE_ROW if kwargs.get("BLOCK_M", named_args.get("BLOCK_M")) == 1 else _FEW_ROWS)


@triton.autotune(configs=_configs(), key=["N", "K", "BLOCK_M", "HAS_C", "HAS_BIAS", "SWIGLU", "ADD_NORM", "PRE_NORM"],
                 prune_configs_by={"early_config_prune": _prune}, restore_value=["R"])
@triton.heuristics({"EVEN_K": lambda args: args["K"] % (args["BLOCK_K"] * args["SPLIT_K"]) == 0})
@triton.jit(do_not_specialize=["M"])
def _gemv_kernel(
    X,  # *dtype [M, K], unit K stride, rows stride_xm apart
    W,  # *dtype [N, K], unit K stride, rows stride_wn apart (the nn.Linear weight)
    C,  # *dtype c expanded to [M, N] (zero strides where it broadcasts); unused unless HAS_C
    BIAS,  # *dtype [N]; unused unless HAS_BIAS
    OUT,  # *dtype [M, N]
    PART,  # fp32 [SPLIT_K, tiles, BLOCK_M, BLOCK_N] partial sums (SPLIT_K > 1)
    COUNTER,  # int32 [tiles + 1] splits done per column tile (SPLIT_K > 1), then column tiles done (ADD_NORM); 0
    # between kernels
    R,  # *dtype [M, N] residual, rows stride_rm apart, read then overwritten with the sum (ADD_NORM)
    NW,  # *dtype [N] the norm weight (ADD_NORM), or [K] (PRE_NORM)
    M, N, K,
    stride_xm, stride_wn, stride_cm, stride_cn, stride_om, stride_on, stride_rm,
    alpha,
    beta,
    eps,  # ADD_NORM, PRE_NORM: added to the mean square
    HAS_C: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr,  # tl.dot input precision: "ieee" for fp32 inputs
    BLOCK_M: tl.constexpr,  # 1, or 16, 32, 64 rows (at least M) on tensor cores
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,  # programs sharing a column tile's K range; the last to finish sums them
    EVEN_K: tl.constexpr,  # K is a multiple of BLOCK_K * SPLIT_K: no K mask
    PDL: tl.constexpr,
    SWIGLU: tl.constexpr,  # W is [2N, K] gate|up: OUT = silu(x @ gate.T + b) * (x @ up.T + b), `gemm_swiglu`
    EVICT: tl.constexpr = "",  # the weight loads' eviction policy ("evict_first": read once)
    PIPE: tl.constexpr = 1,  # one row: the K loop's tl.range num_stages (1: loads straight to registers)
    UNROLL: tl.constexpr = 1,  # one row: the K loop's loop_unroll_factor
    SUM_EACH: tl.constexpr = False,  # one row: sum the products over each K step, not once after the loop
    ADD_NORM: tl.constexpr = False,  # R += the product, then OUT = rms_norm(R) * NW: `gemm_add_rms_norm`
    NORM_ROWS: tl.constexpr = 1,  # ADD_NORM: rows the last program normalizes at a time
    NORM_BLOCK: tl.constexpr = 16,  # ADD_NORM: the columns it reads at a time (a power of two)
    NORM_ONE_PASS: tl.constexpr = False,  # ADD_NORM: N <= NORM_BLOCK, a row's sums held in registers (one read)
    PRE_NORM: tl.constexpr = False,  # X's rows normalized as loaded: rms_norm(X) * NW, `rms_norm_gemm`
):
    pdl_start(PDL)
    pid = tl.program_id(0)
    split = tl.program_id(1)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    wn = (rn % N).to(tl.int64)  # rows past the edge re-read valid ones: the main loop needs no N mask
    rk = tl.arange(0, BLOCK_K)
    steps = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K)  # BLOCK_K steps of each split
    k_lo = split * steps * BLOCK_K
    w_ptrs = W + wn[:, None] * stride_wn + k_lo + rk[None, :]
    u_ptrs = w_ptrs + N * stride_wn  # SWIGLU: the up rows, N rows below the gate rows
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if BLOCK_M == 1:
        x_ptrs = X + k_lo + rk
        if PRE_NORM:  # each split reads the whole row once for its mean square (from L2: every program reads it)
            rstd = _row_rstd(X + rk, rk, K, eps, BLOCK_K, True)
        acc1 = tl.zeros((BLOCK_N,), dtype=tl.float32)  # SUM_EACH: summed each step
        acc1_u = tl.zeros((BLOCK_N,), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)  # else summed over K once, after the loop
        acc2_u = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k in tl.range(0, steps, num_stages=PIPE, loop_unroll_factor=UNROLL):
            k_ok = rk < K - k_lo - k * BLOCK_K
            if EVEN_K:
                w = tl.load(w_ptrs, eviction_policy=EVICT)
                x = tl.load(x_ptrs)
            else:
                w = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0, eviction_policy=EVICT)
                x = tl.load(x_ptrs, mask=k_ok, other=0.0)
            if PRE_NORM:
                x = _normalized(x, NW + k_lo + k * BLOCK_K + rk, k_ok, rstd, EVEN_K)
            xf = x.to(tl.float32)[None, :]
            if SUM_EACH:
                acc1 += tl.sum(w.to(tl.float32) * xf, axis=1)
            else:
                acc2 += w.to(tl.float32) * xf
            if SWIGLU:
                if EVEN_K:
                    u = tl.load(u_ptrs, eviction_policy=EVICT)
                else:
                    u = tl.load(u_ptrs, mask=k_ok[None, :], other=0.0, eviction_policy=EVICT)
                if SUM_EACH:
                    acc1_u += tl.sum(u.to(tl.float32) * xf, axis=1)
                else:
                    acc2_u += u.to(tl.float32) * xf
                u_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
        if SUM_EACH:
            acc = acc1[None, :]
            if SWIGLU:
                acc_u = acc1_u[None, :]
        else:
            acc = tl.sum(acc2, axis=1)[None, :]
            if SWIGLU:
                acc_u = tl.sum(acc2_u, axis=1)[None, :]
    else:
        rm = tl.arange(0, BLOCK_M)
        xm = rm % M
        x_ptrs = X + xm[:, None].to(tl.int64) * stride_xm + k_lo + rk[None, :]
        if PRE_NORM:
            rstd = _row_rstd(X + xm[:, None].to(tl.int64) * stride_xm + rk[None, :], rk[None, :], K, eps,
                             BLOCK_K, False)[:, None]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, steps):
            k_ok = rk[None, :] < K - k_lo - k * BLOCK_K
            if EVEN_K:
                w = tl.load(w_ptrs, eviction_policy=EVICT)
                x = tl.load(x_ptrs)
            else:
                w = tl.load(w_ptrs, mask=k_ok, other=0.0, eviction_policy=EVICT)
                x = tl.load(x_ptrs, mask=k_ok, other=0.0)
            if PRE_NORM:
                x = _normalized(x, NW + k_lo + k * BLOCK_K + rk[None, :], k_ok, rstd, EVEN_K)
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
            if SWIGLU:
                if EVEN_K:
                    u = tl.load(u_ptrs, eviction_policy=EVICT)
                else:
                    u = tl.load(u_ptrs, mask=k_ok, other=0.0, eviction_policy=EVICT)
                acc_u = tl.dot(x, tl.trans(u), acc_u, input_precision=PRECISION)
                u_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K

    rm = tl.arange(0, BLOCK_M)
    if SPLIT_K > 1:  # publish this split's sums; the last split of the tile adds them all up
        parts = 2 if SWIGLU else 1  # the gate's sum, then the up rows'
        tile = (PART + pid.to(tl.int64) * parts * BLOCK_M * BLOCK_N + rm[:, None] * BLOCK_N
                + tl.arange(0, BLOCK_N)[None, :])
        stride_split = tl.num_programs(0).to(tl.int64) * parts * BLOCK_M * BLOCK_N
        tl.store(tile + split * stride_split, acc)
        if SWIGLU:
            tl.store(tile + split * stride_split + BLOCK_M * BLOCK_N, acc_u)
        tl.debug_barrier()  # every thread's partial is stored before the count says so
        done = tl.atomic_add(COUNTER + pid, 1, sem="acq_rel")
        if done == SPLIT_K - 1:
            tl.atomic_xchg(COUNTER + pid, 0)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(0, SPLIT_K):  # read past L1: other programs wrote them
                acc += tl.load(tile + s * stride_split, cache_modifier=".cg")
                if SWIGLU:
                    acc_u += tl.load(tile + s * stride_split + BLOCK_M * BLOCK_N, cache_modifier=".cg")
            if ADD_NORM:
                _add_norm_epilogue(acc, BIAS, R, NW, OUT, COUNTER, rm, rn, M, N, stride_rm, stride_om, eps,
                                   HAS_BIAS, NORM_ROWS, NORM_BLOCK, NORM_ONE_PASS)
            else:
                _epilogue(acc, acc_u, C, BIAS, OUT, rm, rn, M, N, stride_cm, stride_cn, stride_om, stride_on,
                          alpha, beta, HAS_C, HAS_BIAS, SWIGLU)
    elif ADD_NORM:
        _add_norm_epilogue(acc, BIAS, R, NW, OUT, COUNTER, rm, rn, M, N, stride_rm, stride_om, eps, HAS_BIAS,
                           NORM_ROWS, NORM_BLOCK, NORM_ONE_PASS)
    else:
        _epilogue(acc, acc_u, C, BIAS, OUT, rm, rn, M, N, stride_cm, stride_cn, stride_om, stride_on, alpha, beta,
                  HAS_C, HAS_BIAS, SWIGLU)


@triton.jit
def _row_rstd(ptrs, cols, K, eps, BLOCK_K: tl.constexpr, ONE_ROW: tl.constexpr):
    """``rsqrt(mean(x**2) + eps)`` in fp32 of the rows whose first `BLOCK_K` values `ptrs` points at (``[BLOCK_K]``
    for one row, ``[rows, BLOCK_K]`` for a block), `cols` (``arange(BLOCK_K)``, ``[1, BLOCK_K]`` for a block) their
    columns, over all K values, `BLOCK_K` at a time: `rms_norm`'s mean square; a scalar (`ONE_ROW`: the squares
    summed once after the loop), or one value per row (summed each step)."""
    if ONE_ROW:  # one row: the squares summed once, after the loop
        squares = tl.zeros(ptrs.shape, dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            v = tl.load(ptrs + k0, mask=k0 + cols < K, other=0.0).to(tl.float32)
            squares += v * v
        total = tl.sum(squares, axis=0)
    else:  # a block: summed each step (fewer registers)
        total = tl.sum(tl.zeros(ptrs.shape, dtype=tl.float32), axis=1)
        for k0 in range(0, K, BLOCK_K):
            v = tl.load(ptrs + k0, mask=k0 + cols < K, other=0.0).to(tl.float32)
            total += tl.sum(v * v, axis=1)
    return tl.rsqrt(total / K + eps)


@triton.jit
def _normalized(x, nw_ptrs, k_ok, rstd, EVEN_K: tl.constexpr):
    """The loaded tile `x` of X normalized as `rms_norm` rounds it: ``(x * rstd).to(dtype) * norm weight``, the
    product rounded to the dtype (the masked columns, loaded as 0, stay 0)."""
    dtype = x.dtype
    nw = tl.load(nw_ptrs) if EVEN_K else tl.load(nw_ptrs, mask=k_ok, other=0.0)
    return ((x.to(tl.float32) * rstd).to(dtype).to(tl.float32) * nw.to(tl.float32)).to(dtype)


@triton.jit
def _epilogue(acc, acc_u, C, BIAS, OUT, rm, rn, M, N, stride_cm, stride_cn, stride_om, stride_on, alpha, beta,
              HAS_C: tl.constexpr, HAS_BIAS: tl.constexpr, SWIGLU: tl.constexpr):
    """``alpha * acc + beta * c + bias`` in fp32, rounded once into `OUT`'s rows `rm` and columns `rn`; with
    `SWIGLU`, ``silu(gate) * up`` of the two sums (each with its bias) rounded as `gemm` then `silu_and_mul` round."""
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    out_ptrs = OUT + rm[:, None].to(tl.int64) * stride_om + rn[None, :] * stride_on
    dtype = OUT.dtype.element_ty
    if SWIGLU:
        if HAS_BIAS:
            acc += tl.load(BIAS + rn, mask=rn < N).to(tl.float32)[None, :]
            acc_u += tl.load(BIAS + N + rn, mask=rn < N).to(tl.float32)[None, :]
        gate = acc.to(dtype).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)  # F.silu rounded to the dtype
        tl.store(out_ptrs, (act * acc_u.to(dtype).to(tl.float32)).to(dtype), mask=mask)
    else:
        acc = acc * alpha
        if HAS_C:
            c = tl.load(C + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn, mask=mask)
            acc += beta * c.to(tl.float32)
        if HAS_BIAS:
            acc += tl.load(BIAS + rn, mask=rn < N).to(tl.float32)[None, :]
        tl.store(out_ptrs, acc.to(dtype), mask=mask)


@triton.jit
def _add_norm_epilogue(acc, BIAS, R, NW, OUT, COUNTER, rm, rn, M, N, stride_rm, stride_om, eps,
                       HAS_BIAS: tl.constexpr, NORM_ROWS: tl.constexpr, NORM_BLOCK: tl.constexpr,
                       NORM_ONE_PASS: tl.constexpr):
    """`gemm_add_rms_norm`'s epilogue: ``R <- (acc + bias rounded to the dtype) + R`` (rounded) on this program's
    rows `rm` and columns `rn`; then the program that counts itself last of the column tiles on
    ``COUNTER[tiles]`` (after a barrier, acquire-release, as the split-K count) resets it and normalizes the whole
    rows: ``OUT = (R * rsqrt(mean(R**2) + eps)).to(dtype) * NW``, `NORM_ROWS` rows by `NORM_BLOCK` columns at a
    time (a row of at most `NORM_BLOCK` read once, `NORM_ONE_PASS`, else twice), the mean square in fp32
    (`fused_add_rms_norm`'s roundings)."""
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    dtype = OUT.dtype.element_ty
    if HAS_BIAS:
        acc += tl.load(BIAS + rn, mask=rn < N).to(tl.float32)[None, :]
    r_ptrs = R + rm[:, None].to(tl.int64) * stride_rm + rn[None, :]
    total = acc.to(dtype).to(tl.float32) + tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(r_ptrs, total.to(dtype), mask=mask)
    tl.debug_barrier()  # every thread's sums are stored before the count says so
    tiles = tl.num_programs(0)
    done = tl.atomic_add(COUNTER + tiles, 1, sem="acq_rel")
    if done == tiles - 1:
        tl.atomic_xchg(COUNTER + tiles, 0)
        cols = tl.arange(0, NORM_BLOCK)
        for r0 in range(0, M, NORM_ROWS):
            rows = r0 + tl.arange(0, NORM_ROWS)
            row_ok = rows < M
            base = R + rows[:, None].to(tl.int64) * stride_rm
            out_base = OUT + rows[:, None].to(tl.int64) * stride_om
            if NORM_ONE_PASS:
                ok = row_ok[:, None] & (cols[None, :] < N)
                # read past L1: other programs wrote them
                s = tl.load(base + cols[None, :], mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
                rstd = tl.rsqrt(tl.sum(s * s, axis=1) / N + eps)
                w = tl.load(NW + cols, mask=cols < N, other=0.0).to(tl.float32)
                y = (s * rstd[:, None]).to(dtype).to(tl.float32) * w[None, :]
                tl.store(out_base + cols[None, :], y.to(dtype), mask=ok)
            else:
                squares = tl.zeros((NORM_ROWS,), dtype=tl.float32)
                for c0 in range(0, N, NORM_BLOCK):
                    ok = row_ok[:, None] & (c0 + cols[None, :] < N)
                    s = tl.load(base + c0 + cols[None, :], mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
                    squares += tl.sum(s * s, axis=1)
                rstd = tl.rsqrt(squares / N + eps)
                for c0 in range(0, N, NORM_BLOCK):
                    ok = row_ok[:, None] & (c0 + cols[None, :] < N)
                    s = tl.load(base + c0 + cols[None, :], mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
                    w = tl.load(NW + c0 + cols, mask=c0 + cols < N, other=0.0).to(tl.float32)
                    y = (s * rstd[:, None]).to(dtype).to(tl.float32) * w[None, :]
                    tl.store(out_base + c0 + cols[None, :], y.to(dtype), mask=ok)


_GEMV = Tuned(_gemv_kernel)
_FIXED = Launcher(_gemv_kernel.fn)  # a `TABLE` variant: the heuristics and the kernel, no autotuning
_KWARGS: dict[Variant, dict[str, Any]] = {}  # a variant's launch keywords


def serves(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether this kernel takes the Gemm of `a` ``[M, K]`` by `b` ``[K, N]`` (as read, the transposes applied)
    into `out`: 2-D, 1 <= M <= `MAX_ROWS` (up to `TABLE_ROWS` where `TABLE` names a variant for the shape), unit
    K strides of `a` and of `b`'s ``[N, K]`` storage, and offsets that fit int32 in `a`."""
    return (a.dim() == 2 and out.dim() == 2 and b.dim() == 2
            and takes(a.shape[0], b.shape[1], a.stride(0), a.stride(1), b.stride(0), k=a.shape[1]))


def takes(m: int, n: int, stride_xm: int, stride_xk: int, stride_wk: int, *, k: int = 0,
          swiglu: bool = False) -> bool:
    """`serves` from the sizes and strides of a 2-D product already read: ``x [m, k]``, ``n`` output columns of
    the weight ``[n, k]`` (``[2n, k]`` with `swiglu`)."""
    if not (stride_xk == 1 and stride_wk == 1 and n > 0 and m >= 1 and m * stride_xm < 2**31):
        return False
    return m <= MAX_ROWS or (m <= TABLE_ROWS and (row_class(m), n, k, swiglu) in TABLE)


def _scratch(device: torch.device, counters: int, floats: int) -> tuple[torch.Tensor, torch.Tensor]:
    """At least `floats` fp32 partial sums and `counters` zeroed int32 counters of a split-K product on `device`
    and its current stream (the kernel leaves the counters at 0), grown as needed, at least `_MIN_FLOATS` and
    `_MIN_COUNTERS` (every variant at the Qwen3-0.6B and Mamba-2-130m shapes: no growth, in particular none while a CUDA
    graph is captured, where the counters' zero fill would not run before the capture's kernels). A grown pair
    replaces the old one, which is kept alive: a captured CUDA graph may still address it."""
    if device.type != "cuda":  # the interpreter's CPU tensors
        return _scratch_at(device, 0, device, counters, floats)
    index = torch.cuda.current_device() if device.index is None else device.index
    return _scratch_at(index, torch._C._cuda_getCurrentRawStream(index), device, counters, floats)


def _scratch_of(x: torch.Tensor, counters: int, floats: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`_scratch` on `x`'s device: its index and stream read without a ``torch.device`` (issue #25)."""
    index = x.get_device()  # -1 off CUDA (the interpreter's CPU tensors)
    if index < 0 or not x.is_cuda:
        return _scratch(x.device, counters, floats)
    found = _SCRATCH.get((index, torch._C._cuda_getCurrentRawStream(index)))
    if found is not None and found[0].numel() >= floats and found[1].numel() >= counters:
        return found
    return _scratch(x.device, counters, floats)


def _scratch_at(index: int | torch.device, stream: int, device: torch.device, counters: int,
                floats: int) -> tuple[torch.Tensor, torch.Tensor]:
    key = (index, stream)
    found = _SCRATCH.get(key)
    if found is None or found[0].numel() < floats or found[1].numel() < counters:
        if found is not None:
            _RETIRED.append(found)
        floats = next_power_of_2(max(floats, _MIN_FLOATS, 0 if found is None else found[0].numel()))
        counters = next_power_of_2(max(counters, _MIN_COUNTERS, 0 if found is None else found[1].numel()))
        found = _SCRATCH[key] = (torch.empty(floats, dtype=torch.float32, device=device),
                                 torch.zeros(counters, dtype=torch.int32, device=device))
    return found


_MIN_FLOATS = 1 << 22  # 16 MB
_MIN_COUNTERS = 1 << 14
# by (CUDA device index, stream), or (device, 0) off CUDA
_SCRATCH: dict[tuple[int | torch.device, int], tuple[torch.Tensor, torch.Tensor]] = {}
_RETIRED: list[tuple[torch.Tensor, torch.Tensor]] = []


def gemv(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, bias: torch.Tensor | None, alpha: float,
         beta: float, out: torch.Tensor, *, swiglu: bool = False) -> torch.Tensor:
    """``out = alpha * a @ b + beta * c + bias`` for `a` ``[M, K]`` and `b` ``[K, N]`` a transposed ``[N, K]``
    weight, when `serves` says so; `c` is already expanded to ``[M, N]`` (or None: never read). With `swiglu`,
    `b` is ``[K, 2d]`` (the gate columns, then the up columns), `bias` None or ``[2d]`` and `out` ``[M, d]``:
    ``out = silu(a @ gate + b_gate) * (a @ up + b_up)`` (`c`, `alpha`, `beta` unused)."""
    m, k = a.shape
    return launch(a, b, m, out.shape[1], k, a.stride(0), b.stride(1), c, bias, alpha, beta, out, swiglu=swiglu)


def launch(x: torch.Tensor, w: torch.Tensor, m: int, n: int, k: int, stride_xm: int, stride_wn: int,
           c: torch.Tensor | None, bias: torch.Tensor | None, alpha: float, beta: float, out: torch.Tensor, *,
           swiglu: bool = False, variant: Variant | None = None, residual: torch.Tensor | None = None,
           norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
           pre_norm: torch.Tensor | None = None) -> torch.Tensor:
    """`gemv` with the sizes and strides already read (the callers have them): `x` ``[m, k]`` (1 <= m <= 64) with
    rows `stride_xm` apart, `w` the storage of the ``[n, k]`` weight (``[2n, k]`` with `swiglu`) with rows
    `stride_wn` apart, both of unit K stride; `out` ``[m, n]``. With `residual` (``[m, n]``, unit last stride) and
    `norm_weight` (``[n]``): `gemm_add_rms_norm`, ``residual += x @ w.T + bias`` and ``out = rms_norm(residual) *
    norm_weight`` (`c`, `alpha`, `beta` unused), with the variant of the plain product of the shape. With
    `pre_norm` (the ``[k]`` norm weight): `rms_norm_gemm`, x's rows normalized as they are loaded (``rms_norm(x) *
    pre_norm``, each program computing the rows' mean square over K first), with the product's variant. Runs
    `variant`, else `TABLE`'s for the shape, else the autotuned configuration."""
    block_m = row_class(m)
    if variant is None and TABLE:
        variant = TABLE.get((block_m, n, k, swiglu))
    has_c, has_bias, add_norm, pre = c is not None, bias is not None, residual is not None, pre_norm is not None
    c_arg = out if c is None else c
    bias_arg = out if bias is None else bias
    r_arg = out if residual is None else residual
    nw_arg = pre_norm if pre else out if norm_weight is None else norm_weight
    stride_rm = r_arg.stride(0)
    norm = _norm_blocks(block_m, m, n) if add_norm else _NO_NORM
    dtype = x.dtype
    precision = "ieee" if dtype is torch.float32 else "tf32"
    if variant is None:
        tiles = cdiv(n + 64, 8)  # the narrowest candidate's column tiles, past the edge of the widest
        part, counter = _scratch_of(x, tiles, 2 * MAX_SPLIT_K * block_m * 8 * tiles)
        grid = lambda meta: (cdiv(n, meta["BLOCK_N"]), meta["SPLIT_K"])  # noqa: E731
        _GEMV.launch(
            (n, k, block_m, has_c, has_bias, swiglu, add_norm, pre, dtype, c_arg.dtype, bias_arg.dtype), grid,
            x, w, c_arg, bias_arg, out, part, counter, r_arg, nw_arg, m, n, k,
            stride_xm, stride_wn, *c_arg.stride(), *out.stride(), stride_rm,
            float(alpha), float(beta), float(eps),
            HAS_C=has_c, HAS_BIAS=has_bias, PRECISION=precision, BLOCK_M=block_m, SWIGLU=swiglu, ADD_NORM=add_norm,
            PRE_NORM=pre, **norm, **pdl(),
        )
        return out
    config = _KWARGS.get(variant)
    if config is None:
        config = _KWARGS[variant] = variant.config().all_kwargs()
    tiles = cdiv(n, variant.block_n)
    part, counter = _scratch_of(x, tiles + 1, variant.split_k * 2 * block_m * variant.block_n * tiles)
    _FIXED((tiles, variant.split_k), x, w, c_arg, bias_arg, out, part, counter, r_arg, nw_arg, m, n, k,
           stride_xm, stride_wn, *c_arg.stride(), *out.stride(), stride_rm, float(alpha), float(beta), float(eps),
           HAS_C=has_c, HAS_BIAS=has_bias, PRECISION=precision, BLOCK_M=block_m, SWIGLU=swiglu, ADD_NORM=add_norm,
           PRE_NORM=pre, **norm, **pdl(), **config)
    return out


@functools.lru_cache(maxsize=1024)  # a model has a few hidden sizes, and at most 64 rows here
def _norm_blocks(block_m: int, m: int, n: int) -> dict[str, int]:
    """The ``NORM_ROWS``, ``NORM_BLOCK`` and ``NORM_ONE_PASS`` of `gemm_add_rms_norm`'s row norm: up to 2048 columns
    and 4096 values at a time (32 fp32 values a thread at 4 warps), at most the rows there are; one pass over a row
    that fits."""
    block = max(16, min(next_power_of_2(n), _NORM_COLUMNS))
    return {"NORM_ROWS": min(block_m, next_power_of_2(m), max(1, _NORM_VALUES // block)), "NORM_BLOCK": block,
            "NORM_ONE_PASS": n <= block}


_NO_NORM: dict[str, int] = {}
_NORM_COLUMNS = 2048
_NORM_VALUES = 4096

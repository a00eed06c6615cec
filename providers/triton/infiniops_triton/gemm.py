"""Gemm as a tiled Triton kernel with the epilogue fused: ``y = alpha * op(a) @ op(b) + beta * c + bias``.

Each program computes a ``BLOCK_M x BLOCK_N`` tile of one batch entry with fp32 accumulation over
``BLOCK_K`` steps (software-pipelined ``num_stages`` deep, tensor cores through ``tl.dot``), programs
ordered in groups of ``GROUP_M`` row tiles so neighbouring programs share the same panels of ``a`` and
``b`` in L2. Transposes are free: ``op(a)`` and ``op(b)`` are read through their strides. The epilogue
scales by `alpha`, adds ``beta * c`` (read only when ``beta != 0``; broadcast through zero strides) and
the bias in fp32, and rounds once to the output dtype. fp32 inputs use IEEE fp32 dots (no TF32), so
they meet the fp32 tolerance.

Block sizes are autotuned among a few Hopper-friendly configurations per problem class (128x256x64 with
8 warps and 3 or 4 stages, 256x128x64 with 3, 128x128x64 for big problems; 128x128 or 64x128 tiles below that;
one 64x128 config for decode-like M <= 64), once per class, operand layouts, epilogue and dtype
(not per shape); the interpreter uses one small config. A 2-D product of at most 16 rows (64 where
`infiniops_triton._gemv.TABLE` names the shape) by a weight of unit K stride (a decode step's projection) goes
to the decode kernel instead (`infiniops_triton._gemv`), which streams the weight at memory bandwidth.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from infiniops_py import Capability, Implementation, OneOf
from infiniops_triton import _gemv
from infiniops_triton._common import PRIORITY, base_constraints, cdiv
from infiniops_triton._launch import Tuned

__all__ = ["IMPLEMENTATIONS", "gemm"]


def _cfg(m: int, n: int, k: int, stages: int, warps: int) -> triton.Config:
    return triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}, num_stages=stages,
                         num_warps=warps)


# Candidates per problem class; the autotuner times only the class's own (one compile per candidate).
_LARGE = (_cfg(128, 256, 64, 3, 8), _cfg(128, 256, 64, 4, 8), _cfg(256, 128, 64, 3, 8),  # M, N >= 1024
          _cfg(128, 128, 64, 4, 8))
_MEDIUM = (_cfg(128, 128, 64, 4, 4), _cfg(64, 128, 64, 4, 4))
_THIN = (_cfg(64, 128, 64, 4, 4),)  # M <= 64: decode-like
_INTERPRETER = triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 4}, num_warps=4)


def _configs() -> list[triton.Config]:
    if os.environ.get("TRITON_INTERPRET") == "1":  # one config: the interpreter must not autotune
        return [_INTERPRETER]
    return [*_LARGE, *_MEDIUM, *_THIN]  # every candidate: `_prune` keeps the problem's class


def _size_class(m: int, n: int) -> int:
    """0: decode-like (M <= 64), 2: large (M, N >= 1024), 1: between."""
    return 0 if m <= 64 else 2 if min(m, n) >= 1024 else 1


def _prune(configs: list[triton.Config], named_args: dict, **kwargs: object) -> list[triton.Config]:
    """The candidates of the problem's class; 4-byte inputs take half the K step (shared-memory budget)."""
    m, n = named_args["M"], named_args["N"]
    chosen = (_THIN, _MEDIUM, _LARGE)[_size_class(m, n)]
    if named_args["A"].element_size() < 4:
        return list(chosen)
    return [triton.Config({**c.kwargs, "BLOCK_K": 32}, num_stages=c.num_stages, num_warps=c.num_warps)
            for c in chosen]


# Tuned once per (size class, operand layouts, epilogue, dtype), not per shape: a workload of varying M
# (prefill lengths, batch sizes) would otherwise time every candidate again for each new M. For the same
# reason the sizes are not specialized (a compile per "divisible by 16" combination); strides are.
@triton.autotune(configs=_configs(), key=["tune_key", "HAS_C", "HAS_BIAS"],
                 prune_configs_by={"early_config_prune": _prune})
@triton.heuristics({
    "EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0,
    # the contiguity hints of the wrapped row/column indices hold unless the last tile wraps along a unit
    # stride (then a vector load would read past the row instead of wrapping)
    "HINT_M": lambda args: args["stride_am"] != 1 or args["M"] % args["BLOCK_M"] == 0,
    "HINT_N": lambda args: args["stride_bn"] != 1 or args["N"] % args["BLOCK_N"] == 0,
})
@triton.jit(do_not_specialize=["M", "N", "K", "tune_key"])
def _gemm_kernel(
    A,  # *dtype op(a) as [Bt, M, K] through strides (batch stride 0 when a is 2-D)
    B,  # *dtype op(b) as [Bt, K, N] through strides
    C,  # *dtype c expanded to [Bt, M, N] (zero strides where it broadcasts); unused unless HAS_C
    BIAS,  # *dtype [N]; unused unless HAS_BIAS
    OUT,  # *dtype [Bt, M, N]
    M, N, K,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    stride_cb, stride_cm, stride_cn,
    stride_ob, stride_om, stride_on,
    alpha,
    beta,
    tune_key,  # autotuning key only: size class * 4 + (a's K stride is 1) * 2 + (b's N stride is 1)
    HAS_C: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr,  # tl.dot input precision: "ieee" for fp32 inputs
    WIDE: tl.constexpr,  # int64 offsets inside a matrix (one operand spans 2**31 elements or more)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    HINT_M: tl.constexpr,
    HINT_N: tl.constexpr,
):
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * tiles_n)
    first_m = group * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_rows)
    pid_n = (pid % (GROUP_M * tiles_n)) // group_rows

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # rows/cols past the edge re-read valid ones (wrapped), so the loads of the main loop need no M/N mask
    am = rm % M
    bn = rn % N
    if HINT_M:
        am = tl.max_contiguous(tl.multiple_of(am, BLOCK_M), BLOCK_M)
    if HINT_N:
        bn = tl.max_contiguous(tl.multiple_of(bn, BLOCK_N), BLOCK_N)
    if WIDE:
        am = am.to(tl.int64)
        bn = bn.to(tl.int64)
    a_ptrs = A + batch * stride_ab + am[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = B + batch * stride_bb + rk[:, None] * stride_bk + bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    acc = acc * alpha
    rm64 = rm.to(tl.int64)  # the epilogue runs once: 64-bit row offsets cost nothing there
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if HAS_C:
        c = tl.load(C + batch * stride_cb + rm64[:, None] * stride_cm + rn[None, :] * stride_cn, mask=mask)
        acc += beta * c.to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(BIAS + rn, mask=rn < N).to(tl.float32)[None, :]
    out_ptrs = OUT + batch * stride_ob + rm64[:, None] * stride_om + rn[None, :] * stride_on
    tl.store(out_ptrs, acc.to(OUT.dtype.element_ty), mask=mask)


_GEMM = Tuned(_gemm_kernel)


def _reach(t: torch.Tensor) -> int:
    """One past the largest element offset of `t` (how far its addresses reach): its element count when it is
    contiguous."""
    if t.is_contiguous():
        return t.numel()
    return 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None,
    bias: torch.Tensor | None,
    alpha: float,
    beta: float,
    trans_a: bool,
    trans_b: bool,
    out: torch.Tensor,
) -> torch.Tensor:
    """``out = alpha * op(a) @ op(b) + beta * c + bias`` (``torch.addmm`` / FlagGems ``addmm`` semantics).

    Args:
        a: ``[M, K]`` (``[K, M]`` when `trans_a`), optionally with a leading batch dim; float16/bfloat16/
            float32, any strides.
        b: ``[K, N]`` (``[N, K]`` when `trans_b`, the ``nn.Linear`` weight), optionally batched.
        c: None (then it is never read), or broadcastable to ``[M, N]`` / ``[Bt, M, N]``; scaled by `beta`.
        bias: None or ``[N]``.
        alpha, beta: scalars, applied in fp32.
        trans_a, trans_b: read `a` / `b` transposed.
        out: ``[(Bt,) M, N]`` in a's dtype.

    Returns:
        `out`.
    """
    # op(a) and op(b) read through the strides (no transposed views made): the host cost counts (issue #25)
    shape_a, shape_b = a.shape, b.shape
    st_a, st_b = a.stride(), b.stride()
    if trans_a:
        m, k, stride_am, stride_ak = shape_a[-1], shape_a[-2], st_a[-1], st_a[-2]
    else:
        m, k, stride_am, stride_ak = shape_a[-2], shape_a[-1], st_a[-2], st_a[-1]
    if trans_b:
        n, stride_bk, stride_bn = shape_b[-2], st_b[-1], st_b[-2]
    else:
        n, stride_bk, stride_bn = shape_b[-1], st_b[-2], st_b[-1]
    flat = len(shape_a) == 2
    batches = 1 if flat else shape_a[0]
    if m == 0 or n == 0 or batches == 0:
        return out
    if c is not None and c.data_ptr() == out.data_ptr():
        c = c.clone()  # out=c: the autotuner may run the kernel several times, each must read the original c
    if c is not None and c.shape != out.shape:
        c = c.expand(out.shape)
    if flat and _gemv.takes(m, n, stride_am, stride_ak, stride_bk, k=k):
        return _gemv.launch(a, b, m, n, k, stride_am, stride_bn, c, bias, alpha, beta, out)
    st_o = out.stride()
    if flat:
        st_o = (0, *st_o)
        st_c = (0, 0, 0) if c is None else (0, *c.stride())
    else:
        st_c = (0, 0, 0) if c is None else c.stride()
    has_c, has_bias = c is not None, bias is not None
    c_arg = out if c is None else c
    bias_arg = out if bias is None else bias
    grid = lambda meta: (cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"]), batches)  # noqa: E731
    tune_key = _size_class(m, n) * 4 + (stride_ak == 1) * 2 + (stride_bn == 1)
    dtype = a.dtype
    _GEMM.launch(
        (tune_key, has_c, has_bias, dtype, c_arg.dtype, bias_arg.dtype), grid,
        a, b, c_arg, bias_arg, out, m, n, k,
        0 if flat else st_a[0], stride_am, stride_ak, 0 if flat else st_b[0], stride_bk, stride_bn, *st_c, *st_o,
        float(alpha), float(beta), tune_key,
        HAS_C=has_c, HAS_BIAS=has_bias,
        PRECISION="ieee" if dtype is torch.float32 else "tf32",
        WIDE=max(_reach(a), _reach(b), _reach(out)) >= 2**31,
    )
    return out


IMPLEMENTATIONS = [
    Implementation(
        "gemm", "triton", "triton.gemm",
        Capability(*base_constraints(), OneOf("dtype", ("float16", "bfloat16", "float32"))),
        PRIORITY, gemm,
    ),
]

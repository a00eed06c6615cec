"""The decode Gemm: ``out = alpha * x @ w.T + beta * c + bias`` for a few rows of x and an ``nn.Linear`` weight.

A decode step multiplies one to sixteen token rows by each projection weight: the work is one pass over the
weight ``w`` ``[N, K]`` (unit K stride), and the time is the time that pass takes. The tiled kernel
(`infiniops_triton.gemm`) spends it on 64-row tiles of which one row is real; this kernel instead gives each
program ``BLOCK_N`` rows of ``w`` (output columns) and streams that ``[BLOCK_N, K]`` panel in ``BLOCK_K`` steps
of contiguous 16-byte loads, software-pipelined ``num_stages`` deep, so that many programs keep many loads in
flight. The rows of ``x`` (``M * K`` elements, in L2 after the first program) are re-read by every program.
One row (``BLOCK_M == 1``) reduces with a multiply and a row sum in fp32; up to sixteen rows use ``tl.dot`` on
a 16-row tile (fp32 accumulation). The epilogue is the tiled kernel's: `alpha`, ``beta * c`` (read only when
``HAS_C``), the bias, one rounding to the output dtype.

Configurations are autotuned once per ``(N, K, row class)``: a model has a handful of projection shapes.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from infiniops_triton._launch import Tuned

__all__ = ["MAX_ROWS", "gemv", "serves"]

MAX_ROWS = 16  # the rows of x this kernel takes; more go to the tiled kernel


def _cfg(n: int, k: int, warps: int, stages: int) -> triton.Config:
    return triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=warps, num_stages=stages)


# One row: narrow panels (many programs for the N = hidden-size projections); 16 rows: tl.dot needs N >= 16.
_ONE_ROW = (_cfg(4, 512, 4, 4), _cfg(8, 256, 4, 4), _cfg(8, 512, 4, 3), _cfg(16, 256, 4, 4), _cfg(16, 512, 8, 3),
            _cfg(32, 256, 8, 3))
_FEW_ROWS = (_cfg(16, 128, 4, 4), _cfg(16, 256, 4, 3), _cfg(32, 128, 4, 4), _cfg(64, 128, 4, 3))
_INTERPRETER = (_cfg(16, 32, 4, 1),)


def _configs() -> list[triton.Config]:
    if os.environ.get("TRITON_INTERPRET") == "1":  # one config: the interpreter must not autotune
        return list(_INTERPRETER)
    return [*_ONE_ROW, *_FEW_ROWS]


def _prune(configs: list[triton.Config], named_args: dict, **kwargs: object) -> list[triton.Config]:
    """The row class's candidates (all of them under the interpreter's single config)."""
    if len(configs) == 1:
        return configs
    return list(_ONE_ROW if kwargs.get("BLOCK_M", named_args.get("BLOCK_M")) == 1 else _FEW_ROWS)


@triton.autotune(configs=_configs(), key=["N", "K", "BLOCK_M", "HAS_C", "HAS_BIAS"],
                 prune_configs_by={"early_config_prune": _prune})
@triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
@triton.jit(do_not_specialize=["M"])
def _gemv_kernel(
    X,  # *dtype [M, K], unit K stride, rows stride_xm apart
    W,  # *dtype [N, K], unit K stride, rows stride_wn apart (the nn.Linear weight)
    C,  # *dtype c expanded to [M, N] (zero strides where it broadcasts); unused unless HAS_C
    BIAS,  # *dtype [N]; unused unless HAS_BIAS
    OUT,  # *dtype [M, N]
    M, N, K,
    stride_xm, stride_wn, stride_cm, stride_cn, stride_om, stride_on,
    alpha,
    beta,
    HAS_C: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr,  # tl.dot input precision: "ieee" for fp32 inputs
    BLOCK_M: tl.constexpr,  # 1, or 16 for 2..16 rows
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    wn = (rn % N).to(tl.int64)  # rows past the edge re-read valid ones: the main loop needs no N mask
    rk = tl.arange(0, BLOCK_K)
    w_ptrs = W + wn[:, None] * stride_wn + rk[None, :]
    if BLOCK_M == 1:
        x_ptrs = X + rk
        acc1 = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            if EVEN_K:
                w = tl.load(w_ptrs)
                x = tl.load(x_ptrs)
            else:
                k_left = K - k * BLOCK_K
                w = tl.load(w_ptrs, mask=rk[None, :] < k_left, other=0.0)
                x = tl.load(x_ptrs, mask=rk < k_left, other=0.0)
            acc1 += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
        acc = acc1[None, :]
    else:
        rm = tl.arange(0, BLOCK_M)
        xm = rm % M
        x_ptrs = X + xm[:, None].to(tl.int64) * stride_xm + rk[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            if EVEN_K:
                w = tl.load(w_ptrs)
                x = tl.load(x_ptrs)
            else:
                k_left = K - k * BLOCK_K
                w = tl.load(w_ptrs, mask=rk[None, :] < k_left, other=0.0)
                x = tl.load(x_ptrs, mask=rk[None, :] < k_left, other=0.0)
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K

    rm = tl.arange(0, BLOCK_M)
    acc = acc * alpha
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if HAS_C:
        c = tl.load(C + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn, mask=mask)
        acc += beta * c.to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(BIAS + rn, mask=rn < N).to(tl.float32)[None, :]
    out_ptrs = OUT + rm[:, None].to(tl.int64) * stride_om + rn[None, :] * stride_on
    tl.store(out_ptrs, acc.to(OUT.dtype.element_ty), mask=mask)


_GEMV = Tuned(_gemv_kernel)


def serves(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether this kernel takes the Gemm of `a` ``[M, K]`` by `b` ``[K, N]`` (as read, the transposes applied)
    into `out`: 2-D, 1 <= M <= `MAX_ROWS`, unit K strides of `a` and of `b`'s ``[N, K]`` storage, and offsets
    that fit int32 in `a`."""
    return (a.dim() == 2 and out.dim() == 2 and 1 <= a.shape[0] <= MAX_ROWS and a.stride(1) == 1
            and b.stride(0) == 1 and b.shape[1] > 0 and a.shape[0] * a.stride(0) < 2**31)


def gemv(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, bias: torch.Tensor | None, alpha: float,
         beta: float, out: torch.Tensor) -> torch.Tensor:
    """``out = alpha * a @ b + beta * c + bias`` for `a` ``[M, K]`` and `b` ``[K, N]`` a transposed ``[N, K]``
    weight, when `serves` says so; `c` is already expanded to ``[M, N]`` (or None: never read)."""
    m, k = a.shape
    n = b.shape[1]
    block_m = 1 if m == 1 else 16
    c_arg = out if c is None else c
    bias_arg = out if bias is None else bias
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
    _GEMV.launch(
        (n, k, block_m, c is not None, bias is not None, a.dtype, c_arg.dtype, bias_arg.dtype), grid,
        a, b, c_arg, bias_arg, out, m, n, k,
        a.stride(0), b.stride(1), *c_arg.stride(), *out.stride(),
        float(alpha), float(beta),
        HAS_C=c is not None, HAS_BIAS=bias is not None,
        PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        BLOCK_M=block_m,
    )
    return out

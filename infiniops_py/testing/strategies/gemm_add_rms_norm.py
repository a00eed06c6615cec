"""Strategies for GemmAddRmsNorm: a projection, then the residual add and RMSNorm (no peer suite: the shapes of the
models' o/down projections cut for CPU, the decode row counts among them).

x ``[T, K]`` ~ N(0, 1), sometimes a column slice of a wider buffer; weight ``[N, K]`` ~ N(0, 1) / sqrt(K) (so the
projection is about N(0, 1), as in a model); the residual ~ N(0, 1), sometimes a column slice too; the norm weight
~ N(1, 0.1) (vLLM's test_layernorm draw); the bias now and then. T from 1 (decode) to 64, N odd or even, K up to
256. On `CaseContext.large` (GPU) runs: Qwen3-0.6B's o and down projections (K 2048 and 3072 -> N 1024), Mamba-2-
130m's out_proj (1536 -> 768) and Llama's (14336 -> 4096) among them, T up to 512.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from infiniops_py.testing.case import Case, CaseContext, randn

__all__ = ["STRATEGIES"]

_T = (1, 2, 5, 16, 17, 64)
_N = (1, 8, 33, 64, 96, 768)
# N == 1 only in fp32/fp64: one column's norm is r / sqrt(r^2 + eps), and where the projection and the residual
# cancel (|r| ~ 1e-2 from |y| ~ 1) the projection's rounding to 16 bits, which the contract keeps, moves it by 0.1
_N_16BIT = _N[1:]
_K = (1, 16, 63, 128, 256)
_EPS = (1e-6, 1e-5)
_LARGE_T = (*_T, 128, 512)
_LARGE_NK = ((1024, 2048), (1024, 3072), (768, 1536), (4096, 14336), (1000, 511))


def gemm_add_rms_norm_case(ctx: CaseContext) -> Case:
    gen = ctx.generator()
    has_bias = ctx.pick("has_bias", (False, True))
    if ctx.large and ctx.draw(st.booleans()):
        n, k = ctx.draw(st.sampled_from(_LARGE_NK))
        t = ctx.draw(st.sampled_from(_LARGE_T))
    else:
        sizes = _N_16BIT if ctx.dtype in (torch.float16, torch.bfloat16) else _N
        t, n, k = ctx.draw(st.sampled_from(_T)), ctx.draw(st.sampled_from(sizes)), ctx.draw(st.sampled_from(_K))
    ctx.record("max_k", k)
    new = {"dtype": ctx.dtype, "device": ctx.device, "generator": gen}
    pad = ctx.draw(st.sampled_from((0, 1, 8)))  # x a column slice of a wider buffer when > 0
    x = randn(t, k + pad, **new)[:, :k]
    weight = randn(n, k, scale=k**-0.5, **new)
    r_pad = ctx.draw(st.sampled_from((0, 4)))  # the residual a column slice too
    residual = randn(t, n + r_pad, **new)[:, :n]
    norm_weight = (randn(n, scale=0.1, **new) + 1.0)
    eps = ctx.draw(st.sampled_from(_EPS))
    kwargs: dict[str, object] = {"bias": randn(n, **new)} if has_bias else {}
    return Case((x, weight, residual, norm_weight, eps), kwargs, mutated=(2,), k=k,
                note=f"x{list(x.shape)} strides {list(x.stride())} N={n} K={k} residual strides "
                     f"{list(residual.stride())} bias={has_bias} eps={eps}")


STRATEGIES = {"gemm_add_rms_norm": gemm_add_rms_norm_case}

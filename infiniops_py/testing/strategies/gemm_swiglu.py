"""Strategies for GemmSwiglu: the SwiGLU MLP's packed gate/up projection (no peer suite: the shapes of the
models' MLPs cut for CPU, the decode row counts among them).

x ``[T, K]`` ~ N(0, 1), sometimes a column slice of a wider buffer; weight ``[2d, K]`` ~ N(0, 1) / sqrt(K) (so the
projections are about N(0, 1), as in a model, and reach SiLU's tails); the bias now and then. T from 1 (decode)
to 64, d odd or even, K up to 256. On `CaseContext.large` (GPU) runs: Qwen3-0.6B's (K 1024, d 3072) and Llama's
(4096, 14336) among them, T up to 512, at most 2**26 weight elements.
"""

from __future__ import annotations

from hypothesis import strategies as st

from infiniops_py.testing.case import Case, CaseContext, randn

__all__ = ["STRATEGIES"]

_T = (1, 2, 5, 16, 17, 64)
_D = (1, 8, 33, 64, 96)
_K = (1, 16, 63, 128, 256)
_LARGE_T = (*_T, 128, 512)
_LARGE_DK = ((3072, 1024), (14336, 4096), (768, 2048), (1000, 511))


def gemm_swiglu_case(ctx: CaseContext) -> Case:
    gen = ctx.generator()
    has_bias = ctx.pick("has_bias", (False, True))
    if ctx.large and ctx.draw(st.booleans()):
        d, k = ctx.draw(st.sampled_from(_LARGE_DK))
        t = ctx.draw(st.sampled_from(_LARGE_T))
    else:
        t, d, k = ctx.draw(st.sampled_from(_T)), ctx.draw(st.sampled_from(_D)), ctx.draw(st.sampled_from(_K))
    ctx.record("max_k", k)
    new = {"dtype": ctx.dtype, "device": ctx.device, "generator": gen}
    pad = ctx.draw(st.sampled_from((0, 1, 8)))  # x a column slice of a wider buffer when > 0
    x = randn(t, k + pad, **new)[:, :k]
    weight = randn(2 * d, k, scale=k**-0.5, **new)
    args: tuple[object, ...] = (x, weight)
    if has_bias:
        args = (x, weight, randn(2 * d, **new))
    return Case(args, k=k, note=f"x{list(x.shape)} strides {list(x.stride())} d={d} K={k} bias={has_bias}")


STRATEGIES = {"gemm_swiglu": gemm_swiglu_case}

"""Strategies for RmsNormGemm: the RMSNorm of a pre-norm block, then its projection (no peer suite: the shapes of the
models' qkv and gate_up projections cut for CPU, the decode row counts among them).

x ``[T, K]`` ~ N(0, 1), sometimes a column slice of a wider buffer (a residual row); the norm weight ~ N(1, 0.1)
(vLLM's test_layernorm draw); weight ``[N, K]`` (``[2d, K]`` with ``swiglu``) ~ N(0, 1) / sqrt(K) (so the
projection is about N(0, 1), as in a model); the bias now and then. T from 1 (decode) to 64, N odd or even, K up to
256 (odd too: the masked K tail of the norm and of the product). On `CaseContext.large` (GPU) runs: Qwen3-0.6B's qkv
(1024 -> 4096) and gate_up (1024 -> 2 x 3072), Mamba-2-130m's in_proj (768 -> 3352) and Llama's gate_up (4096 -> 2 x
14336) among them, T up to 512.
"""

from __future__ import annotations

from hypothesis import strategies as st

from infiniops_py.testing.case import Case, CaseContext, randn

__all__ = ["STRATEGIES"]

_T = (1, 2, 5, 16, 17, 64)
_N = (1, 8, 33, 64, 96, 768)
_K = (1, 16, 63, 128, 256)
_EPS = (1e-6, 1e-5)
_LARGE_T = (*_T, 128, 512)
_LARGE_NK = ((4096, 1024), (3072, 1024), (3352, 768), (14336, 4096), (1000, 511))


def rms_norm_gemm_case(ctx: CaseContext) -> Case:
    gen = ctx.generator()
    has_bias = ctx.pick("has_bias", (False, True))
    swiglu = ctx.pick("swiglu", (False, True))
    if ctx.large and ctx.draw(st.booleans()):
        n, k = ctx.draw(st.sampled_from(_LARGE_NK))
        t = ctx.draw(st.sampled_from(_LARGE_T))
    else:
        t, n, k = ctx.draw(st.sampled_from(_T)), ctx.draw(st.sampled_from(_N)), ctx.draw(st.sampled_from(_K))
    ctx.record("max_k", k)
    new = {"dtype": ctx.dtype, "device": ctx.device, "generator": gen}
    pad = ctx.draw(st.sampled_from((0, 1, 8)))  # x a column slice of a wider buffer when > 0
    x = randn(t, k + pad, **new)[:, :k]
    norm_weight = randn(k, scale=0.1, **new) + 1.0
    rows = 2 * n if swiglu else n
    weight = randn(rows, k, scale=k**-0.5, **new)
    eps = ctx.draw(st.sampled_from(_EPS))
    kwargs: dict[str, object] = {"swiglu": swiglu}
    if has_bias:
        kwargs["bias"] = randn(rows, **new)
    return Case((x, norm_weight, weight, eps), kwargs, k=k,
                note=f"x{list(x.shape)} strides {list(x.stride())} N={n} K={k} swiglu={swiglu} bias={has_bias} "
                     f"eps={eps}")


STRATEGIES = {"rms_norm_gemm": rms_norm_gemm_case}

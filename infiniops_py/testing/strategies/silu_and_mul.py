"""Strategies for SiluAndMul, after vLLM's ``test_activation`` (tokens {7, 83, 2048} x d {512, 13824}) cut for CPU.

Output widths d around the peer's (odd ones kept, and 1), tokens up to 64, x ~ N(0, 1) or twice as wide (the
gate reaches SiLU's tails); rows sometimes strided (the packed gate/up projection a column slice of a wider
buffer), sometimes 3-D or 1-D.

On `CaseContext.large` (GPU) runs, the peer's d 512 and 13824 and Qwen3-0.6B's 3072 are favored, tokens reach
4096 (the decode counts 1..64 among them), with at most 2**24 elements in x.
"""

from __future__ import annotations

from hypothesis import strategies as st

from infiniops_py.testing.case import Case, CaseContext, randn

__all__ = ["STRATEGIES"]

_D = (1, 8, 64, 127, 256, 512, 768, 1000, 1024)
_TOKENS = (1, 2, 7, 16, 33, 64)
# large (GPU) runs
_LARGE_D = (*_D, 3072, 4096, 11008, 13824)
_PEER_D = (512, 3072, 13824)
_LARGE_TOKENS = (*_TOKENS, 83, 256, 2048, 4096)
_LARGE_ELEMENTS = 2**24


def silu_and_mul_case(ctx: CaseContext) -> Case:
    gen = ctx.generator()
    d = ctx.pick("d", _LARGE_D if ctx.large else _D, _PEER_D)
    if ctx.large:
        t = ctx.draw(st.sampled_from([n for n in _LARGE_TOKENS if 2 * n * d <= _LARGE_ELEMENTS] or [1]))
    else:
        t = ctx.draw(st.sampled_from(_TOKENS))
    scale = ctx.draw(st.sampled_from((1.0, 1.0, 4.0)))
    layout = ctx.draw(st.sampled_from(("contiguous", "strided", "3d", "1d")))
    new = {"dtype": ctx.dtype, "device": ctx.device, "scale": scale, "generator": gen}
    if layout == "strided":  # the first 2d columns of a wider row buffer
        x = randn(t, 2 * d + ctx.draw(st.sampled_from((1, 8, d))), **new)[:, : 2 * d]
    elif layout == "3d":
        x = randn(2, t, 2 * d, **new)
    elif layout == "1d":
        x = randn(2 * d, **new)
    else:
        x = randn(t, 2 * d, **new)
    return Case((x,), note=f"x{list(x.shape)} strides {list(x.stride())} {layout} d={d} scale={scale}")


STRATEGIES = {"silu_and_mul": silu_and_mul_case}

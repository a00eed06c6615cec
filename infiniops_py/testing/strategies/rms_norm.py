"""Strategies for RmsNorm and fused add + RmsNorm, after vLLM's ``test_layernorm`` scaled down for CPU.

Hidden sizes from the peer's {8, 768, 769, 5120, 5125, 8192} cut to 1024 (odd sizes kept), tokens up to
64, x and residual scaled by 1/(2H) and weight ~ N(1, 0.1) as the peer draws them; rows sometimes
strided (a slice of a wider buffer), sometimes 3-D, and for the fused op sometimes 3-D rows that cannot
be flattened into one strided dim.

On `CaseContext.large` (GPU) runs, the peer's full sweep: hidden sizes up to 8192 (its own {768, 769, 5120,
5125, 8192} and 4096 favored), tokens up to 4096, at most 2**23 elements per [T, H] (before a layout's
doubling).
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from infiniops_py.testing.case import Case, CaseContext, randn

__all__ = ["STRATEGIES"]

_HIDDEN = (8, 64, 127, 256, 768, 769, 1000, 1024)
_TOKENS = (1, 2, 7, 16, 33, 64)
_EPS = (1e-6, 1e-5)
# large (GPU) runs
_LARGE_HIDDEN = (*_HIDDEN, 2048, 4096, 5120, 5125, 8192)
_PEER_HIDDEN = (768, 769, 4096, 5120, 5125, 8192)
_LARGE_TOKENS = (*_TOKENS, 83, 256, 1024, 4096)
_LARGE_ELEMENTS = 2**23


def _hidden(ctx: CaseContext) -> int:
    if ctx.large:
        return ctx.pick("hidden_size", _LARGE_HIDDEN, _PEER_HIDDEN)
    return ctx.pick("hidden_size", _HIDDEN)


def _rows(ctx: CaseContext, gen: torch.Generator, h: int, *, allow_unflattenable: bool) -> tuple[torch.Tensor, str]:
    """An ``[..., H]`` input, scaled by 1/(2H), in one of the layouts the contract allows."""
    if ctx.large:
        t = ctx.draw(st.sampled_from([n for n in _LARGE_TOKENS if n * h <= _LARGE_ELEMENTS]))
    else:
        t = ctx.draw(st.sampled_from(_TOKENS))
    layout = ctx.draw(st.sampled_from(("contiguous", "strided", "3d", "3d-gapped") if allow_unflattenable
                                      else ("contiguous", "strided", "3d")))
    scale = 1.0 / (2 * h)
    if layout == "strided":  # vLLM's strided input: the first H columns of a [T, 2H] buffer
        x = randn(t, 2 * h, dtype=ctx.dtype, device=ctx.device, scale=scale, generator=gen)[:, :h]
    elif layout == "3d":
        x = randn(2, t, h, dtype=ctx.dtype, device=ctx.device, scale=scale, generator=gen)
    elif layout == "3d-gapped":  # [2, T, H] rows of a [2, T + 1, H] buffer: no single row stride
        x = randn(2, t + 1, h, dtype=ctx.dtype, device=ctx.device, scale=scale, generator=gen)[:, :t]
    else:
        x = randn(t, h, dtype=ctx.dtype, device=ctx.device, scale=scale, generator=gen)
    return x, f"x{list(x.shape)} {layout}"


def _weight(ctx: CaseContext, gen: torch.Generator, h: int) -> torch.Tensor:
    w = torch.randn(h, generator=gen) * 0.1 + 1.0
    return w.to(device=ctx.device, dtype=ctx.dtype)


def rms_norm_case(ctx: CaseContext) -> Case:
    gen = ctx.generator()
    h = _hidden(ctx)
    x, note = _rows(ctx, gen, h, allow_unflattenable=True)
    eps = ctx.draw(st.sampled_from(_EPS))
    return Case((x, _weight(ctx, gen, h)), {"eps": eps}, note=f"{note} eps={eps}")


def fused_add_rms_norm_case(ctx: CaseContext) -> Case:
    gen = ctx.generator()
    h = _hidden(ctx)
    x, note = _rows(ctx, gen, h, allow_unflattenable=True)
    residual = randn(*x.shape, dtype=ctx.dtype, device=ctx.device, scale=1.0 / (2 * h), generator=gen)
    eps = ctx.draw(st.sampled_from(_EPS))
    return Case((x, residual, _weight(ctx, gen, h)), {"eps": eps}, mutated=(0, 1), note=f"{note} eps={eps}")


STRATEGIES = {"rms_norm": rms_norm_case, "fused_add_rms_norm": fused_add_rms_norm_case}

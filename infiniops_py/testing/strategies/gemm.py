"""Strategies for Gemm, after FlagGems' ``test_addmm`` grid scaled down for CPU (K up to 256).

Shapes: the peer's (M, N, K) triples (K of 1024 cut to 256) or random ones; alpha = beta from the peer's
{0.001, -0.999, 100.001, -111.999}; a and b row- or column-major; c full, a row ``[N]`` or a column
``[M, 1]``; now and then a NaN-filled c with beta = 0 (it must never be read), or out = c (in place).

On `CaseContext.large` (GPU) runs, the peer's shapes uncut ((15, 160, 1024), (495, 5333, 71)) and
LLM-like ones up to 1024 x 1024 x 512 (a decode row, a prefill tile), or random M, N up to 1024 and K up
to 512.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from infiniops_py.testing.case import Case, CaseContext, randn

__all__ = ["STRATEGIES"]

_PEER_SHAPES = ((1, 1, 32), (15, 160, 256), (49, 53, 71), (64, 96, 128))
_SCALARS = (0.001, -0.999, 100.001, -111.999)
_LARGE_SHAPES = ((1, 1, 32), (15, 160, 1024), (495, 5333, 71), (1, 1024, 512), (128, 1024, 512), (1024, 1024, 512),
                 (1000, 999, 511))
_FLAGS = (False, True)


def _matrix(ctx: CaseContext, gen: torch.Generator, lead: tuple[int, ...], rows: int, cols: int) -> torch.Tensor:
    """A ``[*lead, rows, cols]`` operand, stored row-major or column-major (a transposed view)."""
    if ctx.draw(st.booleans()):
        return randn(*lead, cols, rows, dtype=ctx.dtype, device=ctx.device, generator=gen).transpose(-1, -2)
    return randn(*lead, rows, cols, dtype=ctx.dtype, device=ctx.device, generator=gen)


def gemm_case(ctx: CaseContext) -> Case:
    gen = ctx.generator()
    batched = ctx.pick("batched", _FLAGS)
    trans_a, trans_b = ctx.pick("trans_a", _FLAGS), ctx.pick("trans_b", _FLAGS)
    has_bias, has_c = ctx.pick("has_bias", _FLAGS), ctx.pick("has_c", _FLAGS)
    if ctx.draw(st.booleans()):
        m, n, k = ctx.draw(st.sampled_from(_LARGE_SHAPES if ctx.large else _PEER_SHAPES))
    elif ctx.large:
        m, n, k = ctx.draw(st.integers(1, 1024)), ctx.draw(st.integers(1, 1024)), ctx.draw(st.integers(1, 512))
    else:
        m, n, k = ctx.draw(st.integers(1, 64)), ctx.draw(st.integers(1, 96)), ctx.draw(st.integers(1, 256))
    ctx.record("max_k", k)
    lead = (ctx.draw(st.integers(1, 3)),) if batched else ()
    a = _matrix(ctx, gen, lead, *((k, m) if trans_a else (m, k)))
    b = _matrix(ctx, gen, lead, *((n, k) if trans_b else (k, n)))
    kwargs: dict[str, object] = {"trans_a": trans_a, "trans_b": trans_b}
    scalar = ctx.draw(st.sampled_from(_SCALARS))
    kwargs["alpha"] = scalar if ctx.draw(st.booleans()) else 1.0
    note = f"{lead} M={m} N={n} K={k} trans=({trans_a},{trans_b}) alpha={kwargs['alpha']}"
    if has_bias:
        kwargs["bias"] = randn(n, dtype=ctx.dtype, device=ctx.device, generator=gen)
        note += " bias"
    if has_c:
        c_shape = ctx.draw(st.sampled_from(((*lead, m, n), (n,), (m, 1))))
        kwargs["c"] = randn(*c_shape, dtype=ctx.dtype, device=ctx.device, generator=gen)
        kwargs["beta"] = scalar
        note += f" c{list(c_shape)} beta={scalar}"
        if c_shape == (*lead, m, n) and ctx.draw(st.integers(0, 4)) == 0:
            kwargs["out"] = kwargs["c"]
            note += " out=c"
    elif ctx.draw(st.integers(0, 3)) == 0:
        kwargs["c"] = torch.full((m, n), math.nan, dtype=ctx.dtype, device=ctx.device)
        kwargs["beta"] = 0.0
        note += " NaN c with beta=0"
    return Case((a, b), kwargs, k=k, note=note)


STRATEGIES = {"gemm": gemm_case}

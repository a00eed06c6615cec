"""Strategies for Add: broadcasting shapes (FlagGems test_add's grid: 0-D to 5-D), in place or not.

On `CaseContext.large` (GPU) runs, now and then the peer's own shapes ((1024, 1024), (20, 320, 15),
(16, 128, 64, 60)) and random ones with dims up to 48.
"""

from __future__ import annotations

from hypothesis import strategies as st

from infiniops_py.testing.case import Case, CaseContext, randn

__all__ = ["STRATEGIES"]

_PEER_SHAPES = ((1024, 1024), (20, 320, 15), (16, 128, 64, 60), (2, 3, 4, 5, 6))


def add_case(ctx: CaseContext) -> Case:
    gen = ctx.generator()
    if ctx.large and ctx.draw(st.booleans()):
        shape = list(ctx.draw(st.sampled_from(_PEER_SHAPES)))
    else:
        shape = ctx.draw(st.lists(st.integers(1, 48 if ctx.large else 9), min_size=0, max_size=4 if ctx.large else 5))
    broadcast = ctx.pick("broadcast", (False, True))
    inplace = ctx.pick("inplace", (False, True))
    other_shape = list(shape)
    if broadcast and shape:
        # drop leading dims and set some remaining ones to 1
        other_shape = other_shape[ctx.draw(st.integers(0, len(shape) - 1)):]
        other_shape = [1 if ctx.draw(st.booleans()) else n for n in other_shape]
        broadcast = tuple(other_shape) != tuple(shape)
    a = randn(*shape, dtype=ctx.dtype, device=ctx.device, generator=gen)
    b = randn(*other_shape, dtype=ctx.dtype, device=ctx.device, generator=gen)
    alpha = ctx.draw(st.sampled_from((1.0, -0.5, 2.0)))
    if inplace:
        return Case((a, b), {"alpha": alpha, "out": a}, mutated=(0,), note=f"{shape} += {other_shape}")
    return Case((a, b), {"alpha": alpha}, note=f"{shape} + {other_shape}")


STRATEGIES = {"add": add_case}

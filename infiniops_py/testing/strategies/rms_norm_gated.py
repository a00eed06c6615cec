"""Strategies for RmsNormGated, after mamba_ssm's ``test_layernorm_gated`` (its grid: z on/off, bias on/off,
norm before/after the gate, one group or several) cut for CPU.

Hidden sizes from Mamba-2's inner dims scaled down (odd ones kept) with one group, two, four or a group per
channel block; tokens up to 64; x and z ~ N(0, 1), z sometimes twice as wide (SiLU's tails), weight ~ N(1, 0.1),
bias ~ N(0, 0.1); x and z sometimes column slices of one packed buffer (the mixer's ``[z | xBC | dt]``), or 3-D.

On `CaseContext.large` (GPU) runs, Mamba-2's own widths (130m: 1536, one group; 2.7b: 5120; 8 groups of 1024)
are favored and tokens reach 1024.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from infiniops_py.testing.case import Case, CaseContext, randn

__all__ = ["STRATEGIES"]

_HIDDEN = (8, 64, 96, 256, 384, 768, 1000, 1536)
_TOKENS = (1, 2, 7, 16, 33, 64)
_EPS = (1e-6, 1e-5)
# large (GPU) runs
_LARGE_HIDDEN = (*_HIDDEN, 2048, 4096, 5120, 8192)
_PEER_HIDDEN = (1536, 5120, 8192)
_LARGE_TOKENS = (*_TOKENS, 83, 256, 1024)
_LARGE_ELEMENTS = 2**23


def rms_norm_gated_case(ctx: CaseContext) -> Case:
    gen = ctx.generator()
    h = ctx.pick("hidden_size", _LARGE_HIDDEN if ctx.large else _HIDDEN, _PEER_HIDDEN if ctx.large else ())
    groups = [g for g in (1, 2, 4, 8) if h % g == 0]
    group = ctx.pick("group_size", [h // g for g in groups])
    has_z = ctx.pick("has_z", (True, False))
    has_bias = ctx.pick("has_bias", (False, True))
    before = ctx.pick("norm_before_gate", (False, True))
    if ctx.large:
        t = ctx.draw(st.sampled_from([n for n in _LARGE_TOKENS if 3 * n * h <= _LARGE_ELEMENTS] or [1]))
    else:
        t = ctx.draw(st.sampled_from(_TOKENS))
    layout = ctx.draw(st.sampled_from(("contiguous", "packed", "3d")))
    z_scale = ctx.draw(st.sampled_from((1.0, 1.0, 4.0)))
    new = {"dtype": ctx.dtype, "device": ctx.device, "generator": gen}
    if layout == "packed":  # z then x as column slices of one [T, 2H + 8] row buffer, as in_proj leaves them
        buf = randn(t, 2 * h + 8, **new)
        z, x = buf[:, :h], buf[:, h:2 * h]
        z.mul_(z_scale)
    elif layout == "3d":
        x, z = randn(2, t, h, **new), randn(2, t, h, scale=z_scale, **new)
    else:
        x, z = randn(t, h, **new), randn(t, h, scale=z_scale, **new)
    weight = (torch.randn(h, generator=gen) * 0.1 + 1.0).to(device=ctx.device, dtype=ctx.dtype)
    bias = randn(h, scale=0.1, **new) if has_bias else None
    eps = ctx.draw(st.sampled_from(_EPS))
    kwargs = {"z": z if has_z else None, "eps": eps, "group_size": group, "norm_before_gate": before}
    return Case((x, weight, bias), kwargs,
                note=f"x{list(x.shape)} {layout} group={group} z={has_z} bias={has_bias} before={before} eps={eps}")


STRATEGIES = {"rms_norm_gated": rms_norm_gated_case}

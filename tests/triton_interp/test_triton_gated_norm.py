"""Triton rms_norm_gated on the CPU under the Triton interpreter: the conformance suite, then the Mamba-2 mixer's
call (x the state update's output, z a column slice of in_proj's output, several groups, a group that is no
power of two in channels) against the float64 reference."""

from __future__ import annotations

import pytest
import torch
from interp_helpers import assert_conformant, check, randn

import infiniops_py

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def test_conformance() -> None:
    assert_conformant("rms_norm_gated", 12)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("before", [False, True], ids=["gate-then-norm", "norm-then-gate"])
def test_mixer_layout_with_groups_no_power_of_two(dtype: torch.dtype, before: bool) -> None:
    t, groups, group = 3, 3, 200  # BLOCK 256: the last 56 lanes of each program masked
    h = groups * group
    zx = randn(t, 2 * h + 40, dtype=dtype, seed=3)  # [z | x-ish | rest], as in_proj leaves the gate
    z, x = zx[:, :h], randn(t, h, dtype=dtype, seed=4)
    weight, bias = randn(h, dtype=dtype, seed=5, scale=0.1) + 1, randn(h, dtype=dtype, seed=6, scale=0.1)
    out = torch.full((t, h), float("nan"), dtype=dtype)
    with infiniops_py.use("triton"):
        got = infiniops_py.rms_norm_gated(x, weight, bias, z=z, eps=1e-5, group_size=group,
                                          norm_before_gate=before, out=out)
    with infiniops_py.use("reference"):
        ref = infiniops_py.rms_norm_gated(x.double(), weight.double(), bias.double(), z=z.double(), eps=1e-5,
                                          group_size=group, norm_before_gate=before)
    assert got is out
    check("rms_norm_gated", got, ref)

"""RmsNorm and fused add + RmsNorm over the last dim (DESIGN.md operator 3).

Public: rms_norm(x, weight, eps=1e-6, *, out=None); fused_add_rms_norm(x, residual, weight, eps=1e-6).
Implementation calling conventions:
  rms_norm: fn(x, weight, eps, out) -> out; x 2-D [T, H] (last stride 1, row stride arbitrary),
    weight [H] same dtype, out 2-D [T, H] contiguous. Variance in fp32; normalized value cast to
    x.dtype, then multiplied by weight.
  fused_add_rms_norm: fn(x, residual, weight, eps) -> None, in place on 2-D [T, H] views:
    residual <- x + residual (rounded to dtype), then x <- rms_norm(residual).
Problem fields (both): hidden_size (int).
"""

from __future__ import annotations

SPECS = ()  # placeholder: the contract module is being written

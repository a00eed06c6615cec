"""Gemm: y = alpha * op(a) @ op(b) + beta * c + bias (DESIGN.md operator 1).

Public: gemm(a, b, *, c=None, bias=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, out=None).
Implementation calling convention: fn(a, b, c, bias, alpha, beta, trans_a, trans_b, out) -> out.
  a: [M, K] ([K, M] when trans_a), or with a leading batch dim; b: [K, N] ([N, K] when trans_b, the
  nn.Linear weight layout); c: None when beta == 0 (never read then), else broadcastable to [M, N];
  bias: None or [N]; out: allocated by gemm, [(Bt,) M, N] in a.dtype. fp32 accumulation.
Problem fields: batched, trans_a, trans_b, has_bias, has_c (all bool).
"""

from __future__ import annotations

SPECS = ()  # placeholder: the contract module is being written

"""What the selective-scan entry points, their references and the providers share: the packed form's type
(`ScanVarlen`), the state dtype, the step-size rule (`process_dt`), the untied view of dt/A/dt_bias and the
D term."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = ["ScanVarlen", "d_term", "process_dt", "state_dtype", "untied_view"]


class ScanVarlen(NamedTuple):
    """The packed form of a `selective_scan` call, as implementations receive it.

    Attributes:
        cu_seqlens: int32/int64 [S + 1] on x's device: sequence i is tokens ``cu_seqlens[i]:cu_seqlens[i+1]``
            of the one row.
        varlen_states: None, or [S, H, P, N] in the state dtype, to fill with each sequence's final state
            (its initial state, or zeros, when it is empty).
    """

    cu_seqlens: torch.Tensor
    varlen_states: torch.Tensor | None


def state_dtype(x_dtype: torch.dtype) -> torch.dtype:
    """The dtype of states and arithmetic for inputs in `x_dtype`: float64 for float64, else float32."""
    return torch.float64 if x_dtype == torch.float64 else torch.float32


def process_dt(dt: torch.Tensor, dt_bias: torch.Tensor | None, dt_softplus: bool,
               dt_limit: tuple[float, float] | None, dtype: torch.dtype) -> torch.Tensor:
    """``softplus(dt + dt_bias)`` (softplus, threshold 20, only when `dt_softplus`), in `dtype`, then
    clamped to ``dt_limit = (low, high)``, or not clamped at all when `dt_limit` is None (the state
    update's rule). dt_bias broadcasts against dt's trailing dims: [H] against [..., H], [H, P] against
    [..., H, P]."""
    dt = dt.to(dtype)
    if dt_bias is not None:
        dt = dt + dt_bias.to(dtype)
    if dt_softplus:
        dt = F.softplus(dt, beta=1.0, threshold=20.0)
    return dt if dt_limit is None else dt.clamp(dt_limit[0], dt_limit[1])


def untied_view(dt: torch.Tensor, A: torch.Tensor, dt_bias: torch.Tensor | None, head_dim: int, d_state: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """dt [B, H, P], A [H, P, N] and dt_bias [H, P] from either form (per-head ones expanded, no copy)."""
    if dt.dim() == 2:
        dt = dt[:, :, None].expand(*dt.shape, head_dim)
    if A.dim() == 1:
        A = A[:, None, None].expand(A.shape[0], head_dim, d_state)
    if dt_bias is not None and dt_bias.dim() == 1:
        dt_bias = dt_bias[:, None].expand(dt_bias.shape[0], head_dim)
    return dt, A, dt_bias


def d_term(D: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``D * x`` for D [H] or [H, P] and x [..., H, P]."""
    d = D.to(x.dtype)
    return (d[:, None] if d.dim() == 1 else d) * x

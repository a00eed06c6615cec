"""The argument checks both selective-scan entry points share; each raises `ContractError` naming the
argument."""

from __future__ import annotations

from typing import Final

import torch

from infiniops_py.operators._base import FLOAT_DTYPES, ContractError, check_device, check_dtype, check_shape

__all__ = ["STATE_DTYPES", "check_groups", "check_like_x", "check_params", "last_dense"]

STATE_DTYPES: Final = (torch.float32, torch.float64)
_STATE_SET: Final = frozenset(STATE_DTYPES)
_FLOAT_SET: Final = frozenset(FLOAT_DTYPES)


def last_dense(op: str, name: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ContractError(op, name, f"strides {t.stride()}: the last dim needs stride 1; call .contiguous()")


def check_like_x(op: str, name: str, t: torch.Tensor, x: torch.Tensor, shape: tuple[int, ...], what: str) -> None:
    check_device(op, name, t, x.device)
    if t.dtype != x.dtype:
        raise ContractError(op, name, f"expected dtype {x.dtype} (same as x), got {t.dtype}")
    check_shape(op, name, t, shape, what)
    last_dense(op, name, t)


def check_params(op: str, x: torch.Tensor, heads: int, head_dim: int, A: torch.Tensor,
                 D: torch.Tensor | None, dt_bias: torch.Tensor | None, d_state: int | None = None) -> None:
    """A [H] fp32 (fp64 allowed), D [H] or [H, P], dt_bias [H], any float dtype; with `d_state` (the state
    update) also the untied forms A [H, P, N] and dt_bias [H, P]."""
    device, per_head, per_channel = x.device, (heads,), (heads, head_dim)
    shape = A.shape  # the common case first, each attribute read once; the checks below name what is wrong
    a_ok = A.device == device and A.dtype in _STATE_SET and (
        shape == per_head or (d_state is not None and shape == (heads, head_dim, d_state)))
    d_ok = D is None or (D.device == device and D.dtype in _FLOAT_SET and (
        (shape := D.shape) == per_head or shape == per_channel))
    bias_ok = dt_bias is None or (dt_bias.device == device and dt_bias.dtype in _FLOAT_SET and (
        (shape := dt_bias.shape) == per_head or (d_state is not None and shape == per_channel)))
    if a_ok and d_ok and bias_ok:
        return
    _check_params(op, x, heads, head_dim, A, D, dt_bias, d_state)


def _check_params(op: str, x: torch.Tensor, heads: int, head_dim: int, A: torch.Tensor,
                  D: torch.Tensor | None, dt_bias: torch.Tensor | None, d_state: int | None) -> None:
    check_device(op, "A", A, x.device)
    check_dtype(op, "A", A, STATE_DTYPES, " (A is kept in float32)")
    if d_state is None:
        check_shape(op, "A", A, (heads,), " ([H])")
    elif list(A.shape) not in ([heads], [heads, head_dim, d_state]):
        raise ContractError(op, "A", f"expected shape [{heads}] or [{heads}, {head_dim}, {d_state}] ([H] or "
                                     f"[H, P, N]), got {list(A.shape)}")
    if D is not None:
        check_device(op, "D", D, x.device)
        check_dtype(op, "D", D, FLOAT_DTYPES)
        if list(D.shape) not in ([heads], [heads, head_dim]):
            raise ContractError(op, "D", f"expected shape [{heads}] or [{heads}, {head_dim}] ([H] or [H, P]), "
                                         f"got {list(D.shape)}")
    if dt_bias is not None:
        check_device(op, "dt_bias", dt_bias, x.device)
        check_dtype(op, "dt_bias", dt_bias, FLOAT_DTYPES)
        if d_state is None:
            check_shape(op, "dt_bias", dt_bias, (heads,), " ([H])")
        elif list(dt_bias.shape) not in ([heads], [heads, head_dim]):
            raise ContractError(op, "dt_bias", f"expected shape [{heads}] or [{heads}, {head_dim}] ([H] or "
                                               f"[H, P]), got {list(dt_bias.shape)}")


def check_groups(op: str, B: torch.Tensor, heads: int) -> int:
    groups = B.shape[-2]
    if groups == 0 or heads % groups:
        raise ContractError(op, "B", f"n_groups G={groups} (B.shape[-2]) must divide the head count H={heads}")
    return groups

"""causal_conv1d's width limits, the packed form's argument type (`ConvVarlen`) and the argument checks that
both entry points share. Each check raises `ContractError` naming the argument."""

from __future__ import annotations

import itertools
from typing import Final, NamedTuple

import torch

from infiniops_py.operators._base import (
    FLOAT_DTYPES,
    ContractError,
    check_device,
    check_dtype,
    check_shape,
    check_writable,
    is_checked,
)

__all__ = ["MAX_WIDTH", "MIN_WIDTH", "ConvVarlen", "check_activation", "check_cu_seqlens", "check_layout",
           "check_state_like_x", "check_weight", "check_x", "empty_like_layout"]

MIN_WIDTH: Final = 2
MAX_WIDTH: Final = 16
_FLOAT_SET: Final = frozenset(FLOAT_DTYPES)


class ConvVarlen(NamedTuple):
    """The packed form of a `causal_conv1d` call, as implementations receive it (vLLM's names).

    Attributes:
        conv_states: [slots, D, S >= W-1] in x's dtype, read and written in place.
        query_start_loc: int32/int64 [nseq + 1]: sequence i is columns ``query_start_loc[i]:query_start_loc[i+1]``.
        cache_indices: int32/int64 [nseq] slot per sequence (< 0: padding), or None (sequence i, slot i).
        has_initial_state: bool [nseq], or None (no sequence reads its slot).
    """

    conv_states: torch.Tensor
    query_start_loc: torch.Tensor
    cache_indices: torch.Tensor | None
    has_initial_state: torch.Tensor | None


def check_cu_seqlens(op: str, name: str, cu: torch.Tensor, total: int) -> None:
    """In checked mode (`is_checked`), raise `ContractError` unless the cumulative lengths `cu` [S + 1]
    start at 0, never decrease and end at `total` (the packed tokens); reads the values on the host."""
    if not is_checked(cu.device):
        return
    values = cu.tolist()
    if values[0] != 0 or values[-1] != total or any(b < a for a, b in itertools.pairwise(values)):
        raise ContractError(op, name, f"{values[:8]}{'...' if len(values) > 8 else ''}: expected cumulative "
                                      f"lengths from 0, non-decreasing, ending at {total} (the packed tokens)")


def check_weight(op: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> int:
    """Check weight [D, W] and bias [D]; return W."""
    dim, shape, device = x.shape[1], weight.shape, x.device
    if len(shape) == 2 and shape[0] == dim and MIN_WIDTH <= shape[1] <= MAX_WIDTH and weight.dtype in _FLOAT_SET \
            and weight.device == device and (bias is None or (bias.device == device and bias.dtype is weight.dtype
                                                              and bias.shape == (dim,))):
        return shape[1]  # the common case in a few attribute reads; the checks below name what is wrong
    check_device(op, "weight", weight, x.device)
    check_dtype(op, "weight", weight, FLOAT_DTYPES)
    check_shape(op, "weight", weight, (dim, None), " ([D, W], D = x.shape[1])")
    width = weight.shape[1]
    if not MIN_WIDTH <= width <= MAX_WIDTH:
        raise ContractError(op, "weight", f"width W={width} out of range: need {MIN_WIDTH} <= W <= {MAX_WIDTH}")
    if bias is not None:
        check_device(op, "bias", bias, x.device)
        if bias.dtype != weight.dtype:
            raise ContractError(op, "bias", f"expected dtype {weight.dtype} (same as weight), got {bias.dtype}")
        check_shape(op, "bias", bias, (dim,), " ([D])")
    return width


def check_activation(op: str, activation: str | None) -> bool:
    if activation not in (None, "silu"):
        raise ContractError(op, "activation", f"expected None or 'silu', got {activation!r}")
    return activation == "silu"


def check_layout(op: str, name: str, t: torch.Tensor) -> bool:
    """A [*, C, L] tensor must be dense along C (channel-last) or along L; return whether channel-last."""
    strides = t.stride()
    if strides[2] != 1 and strides[1] != 1:
        raise ContractError(op, name, f"strides {strides}: need stride 1 along dim 2 (channel-first) or "
                                      "dim 1 (channel-last view); call .contiguous()")
    return strides[2] != 1 and t.shape[2] > 1


def check_x(op: str, x: torch.Tensor) -> bool:
    if x.dtype not in _FLOAT_SET:
        check_dtype(op, "x", x, FLOAT_DTYPES)
    if x.dim() != 3:
        raise ContractError(op, "x", f"expected shape [B, D, L], got {list(x.shape)}")
    return check_layout(op, "x", x)


def empty_like_layout(x: torch.Tensor, channel_last: bool) -> torch.Tensor:
    if not channel_last:
        return torch.empty_like(x, memory_format=torch.contiguous_format)
    b, d, length = x.shape
    return torch.empty(b, length, d, dtype=x.dtype, device=x.device).transpose(1, 2)


def check_state_like_x(op: str, name: str, t: torch.Tensor, x: torch.Tensor, shape: tuple[int | None, ...],
                       what: str) -> None:
    """A state tensor written in place: x's device and dtype, `shape`, no two elements at one address."""
    check_device(op, name, t, x.device)
    if t.dtype != x.dtype:
        raise ContractError(op, name, f"expected dtype {x.dtype} (same as x), got {t.dtype}")
    check_shape(op, name, t, shape, what)
    check_writable(op, name, t)

"""Add: ``out = input + alpha * other`` with broadcasting (``torch.add`` semantics).

Implementation calling convention: ``fn(input, other, alpha, out) -> out``; `out` is allocated (or
checked) by `add` and has the broadcast shape; it may be `input` itself (in place).
"""

from __future__ import annotations

import torch

from infiniops_py.operators._base import FLOAT_DTYPES, ContractError, OpSpec, check_device, check_dtype, device_type

__all__ = ["SPECS", "add"]

_OP = "add"


def add(
    input: torch.Tensor, other: torch.Tensor, *, alpha: float = 1.0, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``input + alpha * other``, broadcasting like `torch.add`.

    Args:
        input: any shape, dtype float16/bfloat16/float32/float64.
        other: broadcastable with `input`, same dtype and device.
        alpha: scalar multiplier of `other`.
        out: optional output of the broadcast shape, same dtype and device. It may be `input` (in place)
            when the broadcast shape equals ``input.shape``; it must not partially overlap an input, and a
            zero stride on a dimension of size > 1 is rejected (several elements would share one address).

    Returns:
        `out`, or a new tensor of the broadcast shape.

    Raises:
        ContractError: non-broadcastable shapes, a dtype or device mismatch, a bad `out`.
    """
    # The checks run on every call (benchmarks/dispatch.py keeps them under 2 us): each attribute is read
    # once, and a helper is only called to raise.
    dtype = input.dtype
    if dtype not in FLOAT_DTYPES:
        check_dtype(_OP, "input", input, FLOAT_DTYPES)
    if other.dtype is not dtype:
        raise ContractError(_OP, "other", f"expected dtype {dtype} (same as input), got {other.dtype}")
    device = input.device
    if other.device != device:
        check_device(_OP, "other", other, device)
    shape = input.shape
    broadcast = other.shape != shape
    if broadcast:
        try:
            shape = torch.broadcast_shapes(shape, other.shape)
        except RuntimeError:
            raise ContractError(
                _OP, "other", f"shape {list(other.shape)} does not broadcast with input {list(input.shape)}"
            ) from None
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=device)
        inplace = False
    else:
        inplace = _check_out(input, other, out, shape, device)
    return SPEC.call((device_type(input), dtype, broadcast, inplace), input, other, alpha, out)


def _check_out(input: torch.Tensor, other: torch.Tensor, out: torch.Tensor, shape: torch.Size,
               device: torch.device) -> bool:
    if out.shape != shape:
        raise ContractError(_OP, "out", f"expected the broadcast shape {list(shape)}, got {list(out.shape)}")
    if out.dtype is not input.dtype:
        raise ContractError(_OP, "out", f"expected dtype {input.dtype}, got {out.dtype}")
    if out.device != device:
        check_device(_OP, "out", out, device)
    stride = out.stride()
    if 0 in stride and any(st == 0 and n > 1 for st, n in zip(stride, shape)):
        raise ContractError(_OP, "out", f"zero stride {stride} on a dimension of size > 1 (an expanded view)")
    storage = out.untyped_storage().data_ptr()
    inplace = storage == input.untyped_storage().data_ptr() and _same_view("input", input, out)
    if storage == other.untyped_storage().data_ptr():
        inplace = _same_view("other", other, out) or inplace
    return inplace


def _same_view(name: str, t: torch.Tensor, out: torch.Tensor) -> bool:
    """`out` shares `t`'s storage: allowed (True) only as the very same view; False when `t` is empty."""
    if not t.numel():
        return False
    if t.data_ptr() == out.data_ptr() and t.shape == out.shape and t.stride() == out.stride():
        return True
    raise ContractError(_OP, "out", f"partially overlaps {name}; only out=input (same view) is allowed")


def reference(input: torch.Tensor, other: torch.Tensor, alpha: float, out: torch.Tensor) -> torch.Tensor:
    """Literal reference: ``out = input + alpha * other``."""
    out.copy_(input + alpha * other)
    return out


SPEC = OpSpec(
    name=_OP,
    fields={"broadcast": False, "inplace": False},
    function=add,
    reference=reference,
    doc="out = input + alpha * other, broadcasting, optionally in place",
)
SPECS = (SPEC,)

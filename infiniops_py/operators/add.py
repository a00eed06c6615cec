"""Add: ``out = input + alpha * other`` with broadcasting (``torch.add`` semantics).

Implementation calling convention: ``fn(input, other, alpha, out) -> out``; `out` is allocated (or
checked) by `add` and has the broadcast shape; it may be `input` itself (in place). `add` returns that
`out` whatever the implementation returns; the conformance suite holds implementations to returning it.
Problem fields: broadcast, inplace (bools). Size bucket: numel, the `size_class` (power of two at or above) of
out's element count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from infiniops_py.dispatch import dispatch
from infiniops_py.operators._base import (
    FLOAT_DTYPES,
    ContractError,
    byte_extent,
    check_device,
    check_dtype,
    check_no_grad,
    check_real,
    check_tensor,
    check_writable,
    device_type,
    overlaps,
    same_view,
)
from infiniops_py.operators._declare import GIVEN, Operator, Overload, Sampler

__all__ = ["SPECS", "add"]

_OP = "add"
_FLOAT_SET = frozenset(FLOAT_DTYPES)
_Tensor = torch.Tensor
_STRIDED = torch.strided  # a sparse or MKLDNN tensor is refused by check_tensor (issue #30)
_grad_enabled = torch.is_grad_enabled


def reference(input: torch.Tensor, other: torch.Tensor, alpha: float, out: torch.Tensor) -> torch.Tensor:
    """Literal reference: ``out = input + alpha * other``."""
    out.copy_(input + alpha * other)
    return out


def _fake(input: torch.Tensor, other: torch.Tensor, alpha: float) -> torch.Tensor:
    return input.new_empty(torch.broadcast_shapes(input.shape, other.shape))


def sample_inputs(values: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                  generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``numel`` values and as many others, or, broadcast, ``[rows, cols] + [cols]`` (a linear layer's bias);
    ``out`` is the input when in place."""
    r, f = Sampler(generator, dtype, device), values
    numel = f["numel"]
    if f["broadcast"]:  # the bias add of a linear layer: [rows, cols] + [cols]
        cols = min(numel, 1024)
        x, other = r(max(1, numel // cols), cols), r(cols)
    else:
        x, other = r(numel), r(numel)
    return (x, other), {"out": x} if f["inplace"] else {}


SPEC = Operator(
    sample_inputs=sample_inputs,
    tune_sizes={"numel": 1 << 20},
    name=_OP,
    fields={"broadcast": False, "inplace": False},
    buckets=("numel",),
    reference=reference,
    doc="out = input + alpha * other, broadcasting, optionally in place",
    overloads=(Overload(when={"out": None}, fake=_fake),
               Overload("out", when={"out": GIVEN}, outputs=0, returns=("out",))),
    mutates=("out",),
)


@SPEC.define
def add(
    input: torch.Tensor, other: torch.Tensor, *, alpha: float = 1.0, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``input + alpha * other``, broadcasting like `torch.add`.

    Args:
        input: any shape, dtype float16/bfloat16/float32/float64.
        other: broadcastable with `input`, same dtype and device.
        alpha: scalar multiplier of `other`, a finite int or float (not a bool).
        out: optional output of the broadcast shape, same dtype and device. It may be `input` or `other`
            itself, the very same view (in place; for `input` the broadcast shape equals ``input.shape``).
            It may share a storage with them without sharing elements (``out=a[:, :4]`` with
            ``other=a[:, 4:]``, as `torch.add` allows) but must not otherwise overlap them in memory (by
            address, so also through another storage object over the same buffer), and a zero stride on a
            dimension of size > 1 is rejected (several elements would share one address).

    Returns:
        `out`, or a new tensor of the broadcast shape.

    Raises:
        ContractError: a non-tensor, non-broadcastable shapes, a dtype or device mismatch, a bad `alpha`
            or `out`, or a tensor that requires grad while grad mode is on (there is no backward).
    """
    # The checks run on every call (benchmarks/dispatch.py times them): each attribute is read once, and a
    # helper is only called to raise.
    if not (isinstance(input, _Tensor) and isinstance(other, _Tensor) and input.layout is _STRIDED
            and other.layout is _STRIDED):
        check_tensor(_OP, "input", input)
        check_tensor(_OP, "other", other)
    if type(alpha) is not float or alpha - alpha != 0.0:  # NaN and +-inf give NaN
        alpha = check_real(_OP, "alpha", alpha)  # as a float: an int beyond int64 would overflow in torch
    dtype = input.dtype
    if dtype not in _FLOAT_SET:
        check_dtype(_OP, "input", input, FLOAT_DTYPES)
    if other.dtype is not dtype:
        raise ContractError(_OP, "other", f"expected dtype {dtype} (same as input), got {other.dtype}")
    on_cpu = input.is_cpu  # `is_cpu` costs a third of a device comparison
    if (not other.is_cpu) if on_cpu else not (other.is_cuda and other.get_device() == input.get_device()) and \
            other.device != input.device:  # on CUDA two ints compare cheaper than two devices
        check_device(_OP, "other", other, input.device)
    shape = input.shape
    broadcast = other.shape != shape
    if broadcast:
        try:
            shape = torch.broadcast_shapes(shape, other.shape)
        except RuntimeError:
            raise ContractError(
                _OP, "other", f"shape {list(other.shape)} does not broadcast with input {list(input.shape)}"
            ) from None
    if out is None:  # `empty_like` parses no shape, dtype or device: the cheapest allocation (issue #25)
        out = torch.empty(shape, dtype=dtype, device=input.device) if broadcast else torch.empty_like(input)
        inplace = False
    else:
        inplace = _check_out(input, other, out, shape, on_cpu)
    if (input.requires_grad or other.requires_grad or out.requires_grad) and _grad_enabled():  # cheap test first
        check_no_grad(_OP, {"input": input, "other": other, "out": out})
    # The implementation writes `out`; what it returns is not the result (it may be None or another tensor).
    key = SPEC.key("cpu" if on_cpu else device_type(input), dtype, broadcast=broadcast, inplace=inplace,
                   numel=out.numel())
    dispatch(SPEC, key, input, other, alpha, out)
    return out


def _check_out(input: torch.Tensor, other: torch.Tensor, out: torch.Tensor, shape: torch.Size,
               on_cpu: bool) -> bool:
    """Check `out`; return whether it is `input` or `other` itself (the ``inplace`` problem field)."""
    if not isinstance(out, _Tensor) or out.layout is not _STRIDED:
        check_tensor(_OP, "out", out)
    if out.shape != shape:
        raise ContractError(_OP, "out", f"expected the broadcast shape {list(shape)}, got {list(out.shape)}")
    if out.dtype is not input.dtype:
        raise ContractError(_OP, "out", f"expected dtype {input.dtype}, got {out.dtype}")
    if (not out.is_cpu) if on_cpu else out.device != input.device:
        check_device(_OP, "out", out, input.device)
    contiguous = out.is_contiguous()
    if not contiguous:
        check_writable(_OP, "out", out)
    # Addresses, not storage objects, decide: two storages may cover one buffer (two `from_numpy` of views
    # of one array). Only a tensor whose byte range meets out's can share an element with it.
    low = out.data_ptr()
    high = low + (out.nbytes if contiguous else byte_extent(out))
    inplace = input is out
    start = input.data_ptr()
    if not inplace and start < high and low < start + (input.nbytes if input.is_contiguous() else byte_extent(input)):
        inplace = _shares("input", input, out)
    start = other.data_ptr()
    if start < high and low < start + (other.nbytes if other.is_contiguous() else byte_extent(other)):
        inplace = _shares("other", other, out) or inplace
    return inplace


def _shares(name: str, t: torch.Tensor, out: torch.Tensor) -> bool:
    """`t` shares `out`'s storage: True when it is `out` itself, False when no element is shared."""
    if same_view(t, out):
        return True
    if overlaps(t, out):
        raise ContractError(_OP, "out", f"partially overlaps {name}; out may share memory with an input only "
                                        "as that very view (in place)")
    return False


SPECS = (SPEC,)

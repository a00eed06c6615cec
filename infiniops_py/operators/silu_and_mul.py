"""SiluAndMul: ``silu(x[..., :d]) * x[..., d:]``, the SwiGLU MLP's activation (vLLM's ``silu_and_mul``).

Public: silu_and_mul(x, *, out=None) -> out.
Implementation calling convention: fn(x, out) -> out; x 2-D [T, 2d] (last stride 1, row stride arbitrary),
  out 2-D [T, d] contiguous, same dtype. ``silu(gate) = gate * sigmoid(gate)`` is computed in fp32 (fp64 for
  float64 input) and rounded to the dtype, then multiplied by ``up`` (the product rounded to the dtype).
Problem fields: d (int): the output width, half of x's last dim.
Size bucket: tokens, the `size_class` (power of two at or above) of the number of rows T.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from infiniops_py.dispatch import dispatch
from infiniops_py.operators._base import (
    FLOAT_DTYPES,
    ContractError,
    check_dtype,
    check_last_stride,
    check_no_grad,
    check_no_overlap,
    check_out_like,
    check_tensor,
    device_type,
)
from infiniops_py.operators._declare import GIVEN, Operator, Overload, sample_tensor

__all__ = ["SPECS", "reference", "silu_and_mul"]

_OP = "silu_and_mul"
_FLOAT_SET = frozenset(FLOAT_DTYPES)
_Tensor = torch.Tensor
_STRIDED = torch.strided  # a sparse or MKLDNN tensor is refused by check_tensor (issue #30)
_grad_enabled = torch.is_grad_enabled


def reference(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Literal reference: ``F.silu(gate)`` (``gate * sigmoid(gate)``, rounded to the dtype) times ``up``."""
    d = x.shape[-1] // 2
    gate, up = x[:, :d], x[:, d:]
    out.copy_(F.silu(gate) * up)
    return out


def sample_inputs(values: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                  generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``tokens`` rows of ``2 * d`` values (the tuner's call)."""
    return (sample_tensor(generator, values["tokens"], 2 * values["d"], dtype=dtype, device=device),), {}


SPEC = Operator(
    name=_OP,
    fields={"d": 4096},
    buckets=("tokens",),
    reference=reference,
    doc="silu(x[..., :d]) * x[..., d:], the SwiGLU activation of a packed gate/up projection",
    overloads=(Overload(when={"out": None}, fake=lambda x: x.new_empty((*x.shape[:-1], x.shape[-1] // 2))),
               Overload("out", when={"out": GIVEN}, outputs=0, returns=("out",))),
    mutates=("out",),
    sizes={"tokens": (1, 7, 64, 128)},
    sample_inputs=sample_inputs,
)


@SPEC.define
def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` for x ``[..., 2d]``: the gate half through SiLU, times the up half.

    vLLM's ``silu_and_mul`` semantics (``SiluAndMul.forward_native``: ``F.silu(x[..., :d]) * x[..., d:]``;
    HF's ``act_fn(gate_proj(x)) * up_proj(x)`` on the packed projection). vLLM's custom operator writes a
    preallocated output, ``silu_and_mul(out, x)``; this entry point is torch-like instead: `x` first, the
    output optional by keyword. SiLU is computed in fp32 (fp64 for float64 input) and rounded to the dtype,
    then multiplied by the up half, as ``F.silu(gate) * up`` rounds.

    Args:
        x: ``[..., 2d]``, at least one dim, an even last dim (gate columns first, then up), dtype
            float16/bfloat16/float32/float64, last stride 1 (rows may be strided: a column slice of a wider
            buffer is fine).
        out: optional contiguous ``[..., d]`` tensor of `x`'s dtype and device, sharing no memory with `x`.

    Returns:
        `out`, or a new contiguous ``[..., d]`` tensor.

    Raises:
        ContractError: a non-tensor, a 0-d `x`, an odd last dim, a last stride other than 1, a bad `out`
            (shape, dtype, device, layout, or memory shared with `x`), or a tensor that requires grad while
            grad mode is on (there is no backward).
    """
    # The checks run on every call (benchmarks/host_overhead.py times them): each attribute is read once, and
    # a helper is only called to raise.
    if not (isinstance(x, _Tensor) and x.layout is _STRIDED):
        check_tensor(_OP, "x", x)
    if out is not None and not (isinstance(out, _Tensor) and out.layout is _STRIDED):
        check_tensor(_OP, "out", out, optional=True)
    if _grad_enabled() and (x.requires_grad or (out is not None and out.requires_grad)):
        check_no_grad(_OP, {"x": x, "out": out})
    dtype = x.dtype
    if dtype not in _FLOAT_SET:
        check_dtype(_OP, "x", x, FLOAT_DTYPES)
    xs = x.shape
    if not xs:
        raise ContractError(_OP, "x", "expected at least one dim [..., 2d], got a 0-d tensor")
    width = xs[-1]
    if width % 2:
        raise ContractError(_OP, "x", f"expected an even last dim 2d (the gate half, then the up half), got {width}")
    if width > 1 and x.stride(-1) != 1:
        check_last_stride(_OP, "x", x)
    d = width // 2
    shape = (*xs[:-1], d)
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=x.device)
    else:
        _check_out(x, out, shape)
    if len(xs) == 2:
        tokens = xs[0]
        if tokens and d:
            dispatch(SPEC, SPEC.key(device_type(x), dtype, d=d, tokens=tokens), x, out)
        return out
    if out.numel() == 0:
        return out
    x2 = x.view(-1, width) if _viewable(x) else x.reshape(-1, width)
    dispatch(SPEC, SPEC.key(device_type(x), dtype, d=d, tokens=x2.shape[0]), x2, out.view(-1, d))
    return out


def _check_out(x: torch.Tensor, out: torch.Tensor, shape: tuple[int, ...]) -> None:
    check_out_like(_OP, out, shape, x, "x's with its last dim halved")
    check_no_overlap(_OP, "out", out, "x", x)


def _viewable(x: torch.Tensor) -> bool:
    """Whether the leading dims of `x` merge into one strided dim (so ``x.view(-1, 2d)`` is a view)."""
    stride = x.stride()
    return all(stride[i] == stride[i + 1] * x.shape[i + 1] or x.shape[i] == 1 for i in range(x.dim() - 2))


SPECS = (SPEC,)

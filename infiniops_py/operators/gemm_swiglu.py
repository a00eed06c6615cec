"""GemmSwiglu: ``silu(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up)``, the SwiGLU MLP's packed gate/up projection and
its activation as one operator (TensorRT-LLM's ``gemm_swiglu``), so that a provider can apply the activation in the
projection's epilogue instead of writing the ``[T, 2d]`` projection out and reading it back.

Public: gemm_swiglu(x, weight, bias=None, *, out=None) -> out.
Implementation calling convention: fn(x, weight, bias, out) -> out; x [T, K] (last stride 1, rows strided), weight
  [2d, K] (the nn.Linear layout of the packed gate_up_proj: the d gate rows, then the d up rows; last stride 1),
  bias None or [2d] contiguous, out [T, d] contiguous; one dtype. The rounding is that of `gemm` then
  `silu_and_mul`: each projection accumulated in fp32 (with its bias) and rounded to the dtype, SiLU of the gate
  rounded to the dtype, the product rounded once.
Problem fields: has_bias (bool).
Size bucket: m, n, k, the `size_class` of T, d and K.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from infiniops_py.dispatch import dispatch
from infiniops_py.operators._base import (
    ContractError,
    check_like,
    check_no_grad,
    check_no_overlap,
    check_out_like,
    check_projection,
    check_tensor,
    device_type,
)
from infiniops_py.operators._declare import GIVEN, Operator, Overload, sample_tensor

__all__ = ["SPECS", "gemm_swiglu", "reference"]

_OP = "gemm_swiglu"
_Tensor = torch.Tensor
_STRIDED = torch.strided  # a sparse or MKLDNN tensor is refused by check_tensor (issue #30)
_grad_enabled = torch.is_grad_enabled


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    """Literal reference: the projection in float32 (float64 for float64), rounded to the dtype, then
    ``F.silu(gate) * up`` in the dtype, as `gemm` then `silu_and_mul` compute it."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    projected = F.linear(x.to(acc), weight.to(acc), None if bias is None else bias.to(acc)).to(x.dtype)
    d = out.shape[1]
    out.copy_(F.silu(projected[:, :d]) * projected[:, d:])
    return out


def sample_inputs(values: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                  generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``x [m, k]``, the packed weight ``[2n, k]`` scaled by ``k ** -0.5`` and, with ``has_bias``, a ``[2n]``
    bias (the tuner's call)."""
    m, n, k = values["m"], values["n"], values["k"]
    x = sample_tensor(generator, m, k, dtype=dtype, device=device)
    weight = sample_tensor(generator, 2 * n, k, dtype=dtype, device=device, scale=k ** -0.5)
    bias = sample_tensor(generator, 2 * n, dtype=dtype, device=device) if values["has_bias"] else None
    return (x, weight, bias), {}


SPEC = Operator(
    name=_OP,
    fields={"has_bias": False},
    buckets=("m", "n", "k"),
    reference=reference,
    doc="silu(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up): the packed gate/up projection and SwiGLU in one",
    overloads=(Overload(when={"out": None},
                        fake=lambda x, weight, bias: x.new_empty((x.shape[0], weight.shape[0] // 2))),
               Overload("out", when={"out": GIVEN}, outputs=0, returns=("out",))),
    mutates=("out",),
    sizes={"m": (1, 7, 64), "n": (16, 256, 1024), "k": (16, 256, 1024)},
    sample_inputs=sample_inputs,
)


@SPEC.define
def gemm_swiglu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(x @ weight[:d].T + bias[:d]) * (x @ weight[d:].T + bias[d:])`` for the packed gate/up weight.

    Equal to ``silu_and_mul(gemm(x, weight, bias=bias, trans_b=True))`` in value and rounding (TensorRT-LLM's
    ``gemm_swiglu``; HF's ``act_fn(gate_proj(x)) * up_proj(x)`` with the two projections packed, gate first).

    Args:
        x: ``[T, K]`` float16/bfloat16/float32/float64, last stride 1 (rows may be strided).
        weight: ``[2d, K]`` of x's dtype and device, last stride 1: the d gate rows, then the d up rows.
        bias: optional ``[2d]`` contiguous, of x's dtype and device.
        out: optional contiguous ``[T, d]`` of x's dtype and device, sharing no memory with the inputs.

    Returns:
        `out`, or a new contiguous ``[T, d]`` tensor.

    Raises:
        ContractError: a non-tensor or a tensor of another layout than strided; a dim, shape, dtype, device or
            stride other than the above (an odd ``weight.shape[0]``, a K that differs from x's); a bad `out`; a
            tensor that requires grad while grad mode is on (there is no backward).
    """
    # The checks run on every call (benchmarks/host_overhead.py times them): each attribute is read once, and
    # a helper is only called to raise.
    if not (isinstance(x, _Tensor) and isinstance(weight, _Tensor) and x.layout is _STRIDED
            and weight.layout is _STRIDED):
        check_tensor(_OP, "x", x)
        check_tensor(_OP, "weight", weight)
    if bias is not None or out is not None:
        check_tensor(_OP, "bias", bias, optional=True)
        check_tensor(_OP, "out", out, optional=True)
    if _grad_enabled() and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
                            or (out is not None and out.requires_grad)):
        check_no_grad(_OP, {"x": x, "weight": weight, "bias": bias, "out": out})
    form = "[2d, K={k}] (the gate rows, then the up rows)"
    t, k, on_cpu = check_projection(_OP, x, weight, form)
    dtype, rows = x.dtype, weight.shape[0]
    if rows % 2:
        raise ContractError(_OP, "weight", f"expected {form.format(k=k)}, got {list(weight.shape)}")
    d = rows // 2
    if bias is not None:
        check_like(_OP, "bias", bias, x)
        if tuple(bias.shape) != (2 * d,) or not bias.is_contiguous():
            raise ContractError(_OP, "bias", f"expected a contiguous [{2 * d}] (2d), got {list(bias.shape)} "
                                             f"strides {list(bias.stride())}")
    if out is None:
        out = torch.empty((t, d), dtype=dtype, device=x.device)
    else:
        _check_out(out, (t, d), x, weight, bias)
    if not t or not d:
        return out
    if k == 0:  # no product: silu(bias_gate) * bias_up, or zeros
        return reference(x, weight, bias, out)
    dispatch(SPEC, SPEC.key("cpu" if on_cpu else device_type(x), dtype, has_bias=bias is not None, m=t, n=d, k=k),
             x, weight, bias, out)
    return out


def _check_out(out: torch.Tensor, shape: tuple[int, int], x: torch.Tensor, weight: torch.Tensor,
               bias: torch.Tensor | None) -> None:
    check_out_like(_OP, out, shape, x, "[T, d]")
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is not None:
            check_no_overlap(_OP, "out", out, name, t)


SPECS = (SPEC,)

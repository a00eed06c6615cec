"""RmsNormGemm: the RMSNorm of a pre-norm block, then the projection that reads it, as one operator:
``gemm(rms_norm(x, norm_weight, eps), weight, bias=bias, trans_b=True)`` (vLLM's ``RMSNorm`` then the
``QKVParallelLinear`` / ``MergedColumnParallelLinear`` that follows it in a decoder layer), or with ``swiglu``
``gemm_swiglu(rms_norm(x, norm_weight, eps), weight, bias)`` (the packed gate|up projection and SiLU-and-multiply),
so that a provider can normalize each tile of x in the projection's prologue instead of writing the normed rows out
and launching the norm (issue #23: the norm folded into the next GEMV, no serial tail).

Public: rms_norm_gemm(x, norm_weight, weight, eps=1e-6, *, bias=None, swiglu=False, out=None) -> out.
Implementation calling convention: fn(x, norm_weight, weight, bias, eps, swiglu, out) -> None; x [T, K] (last
  stride 1, rows strided), norm_weight [K] contiguous, weight [N, K] (the nn.Linear layout, last stride 1; [2d, K]
  gate rows then up rows with swiglu), bias None or [N] ([2d]) contiguous, out [T, N] ([T, d]) contiguous; one
  dtype, out sharing no memory with the inputs. The rounding is that of `rms_norm` then `gemm` (then
  `silu_and_mul`): the mean square in fp32, the normalized value rounded to the dtype, times the norm weight,
  rounded; the projection accumulated in fp32 (with its bias) and rounded to the dtype; with swiglu SiLU of the
  gate rounded, the product rounded.
Problem fields: has_bias (bool), swiglu (bool).
Size bucket: m, n, k, the `size_class` of T, the output columns (N, or d) and K.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from infiniops_py.dispatch import dispatch
from infiniops_py.operators._base import (
    ContractError,
    check_disjoint,
    check_like,
    check_no_grad,
    check_out_like,
    check_projection,
    check_real,
    check_tensor,
    check_vector,
    device_type,
)
from infiniops_py.operators._declare import GIVEN, Operator, Overload, sample_tensor
from infiniops_py.operators.rms_norm import _normalize

__all__ = ["SPECS", "reference", "rms_norm_gemm"]

_OP = "rms_norm_gemm"
_INF = math.inf
_Tensor = torch.Tensor
_STRIDED = torch.strided  # a sparse or MKLDNN tensor is refused by check_tensor (issue #30)
_grad_enabled = torch.is_grad_enabled


def reference(x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              eps: float, swiglu: bool, out: torch.Tensor) -> None:
    """Literal reference: `rms_norm`'s reference of x, then the projection in float32 (float64 for float64),
    rounded to the dtype, then (with `swiglu`) ``F.silu(gate) * up`` in the dtype."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    normed = _normalize(x, norm_weight, eps)
    projected = F.linear(normed.to(acc), weight.to(acc), None if bias is None else bias.to(acc)).to(x.dtype)
    if swiglu:
        d = out.shape[1]
        out.copy_(F.silu(projected[:, :d]) * projected[:, d:])
    else:
        out.copy_(projected)


def sample_inputs(values: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                  generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``x [m, k]``, a norm weight near 1, the weight ``[n, k]`` (``[2n, k]`` with ``swiglu``) scaled by
    ``k ** -0.5`` and, with ``has_bias``, its bias (the tuner's call)."""
    m, n, k, swiglu = values["m"], values["n"], values["k"], bool(values["swiglu"])
    rows = 2 * n if swiglu else n
    x = sample_tensor(generator, m, k, dtype=dtype, device=device)
    norm_weight = 1 + sample_tensor(generator, k, dtype=dtype, device=device, scale=0.1)
    weight = sample_tensor(generator, rows, k, dtype=dtype, device=device, scale=k ** -0.5)
    bias = sample_tensor(generator, rows, dtype=dtype, device=device) if values["has_bias"] else None
    return (x, norm_weight, weight, 1e-6), {"bias": bias, "swiglu": swiglu}


def _fake(x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor, eps: float,
          bias: torch.Tensor | None, swiglu: bool) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0] // 2 if swiglu else weight.shape[0]))


SPEC = Operator(
    name=_OP,
    fields={"has_bias": False, "swiglu": False},
    buckets=("m", "n", "k"),
    reference=reference,
    doc="out = rms_norm(x) @ weight.T + bias (or its SwiGLU): the RmsNorm and the next projection in one",
    overloads=(Overload(when={"out": None}, fake=_fake),
               Overload("out", when={"out": GIVEN}, outputs=0, returns=("out",))),
    mutates=("out",),
    sizes={"m": (1, 7, 64), "n": (16, 256, 1024), "k": (16, 256, 1024)},
    sample_inputs=sample_inputs,
)


@SPEC.define
def rms_norm_gemm(x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                  bias: torch.Tensor | None = None, swiglu: bool = False,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """``out = rms_norm(x, norm_weight, eps) @ weight.T + bias``; with `swiglu`, ``silu(gate) * up`` of it.

    Equal to ``gemm(rms_norm(x, norm_weight, eps), weight, bias=bias, trans_b=True)`` (with `swiglu`,
    ``gemm_swiglu(rms_norm(x, norm_weight, eps), weight, bias)``) in value and rounding: vLLM's ``RMSNorm`` then
    the linear layer after it, the normed rows never written out.

    Args:
        x: ``[T, K]`` float16/bfloat16/float32/float64, last stride 1 (rows may be strided).
        norm_weight: ``[K]`` contiguous, of x's dtype and device.
        weight: ``[N, K]`` of x's dtype and device, last stride 1 (the ``nn.Linear`` layout); with `swiglu`
            ``[2d, K]``: the d gate rows, then the d up rows.
        eps: added to the mean square, a finite number > 0.
        bias: optional ``[N]`` (``[2d]``) contiguous, of x's dtype and device.
        swiglu: apply SiLU-and-multiply to the gate and up halves (`gemm_swiglu`'s layout).
        out: optional contiguous ``[T, N]`` (``[T, d]``) of x's dtype and device, sharing no memory with the
            inputs.

    Returns:
        `out`, or a new contiguous tensor.

    Raises:
        ContractError: a non-tensor or a tensor of another layout than strided; a dim, shape, dtype, device or
            stride other than the above (a K that differs from x's, an odd ``weight.shape[0]`` with `swiglu`);
            a bad `eps`; `out` sharing memory with an input; a tensor that requires grad while grad mode is on
            (there is no backward).
    """
    # The checks run on every call (benchmarks/host_overhead.py times them): each attribute is read once, and
    # a helper is only called to raise.
    if not (isinstance(x, _Tensor) and isinstance(weight, _Tensor) and isinstance(norm_weight, _Tensor)
            and x.layout is _STRIDED and weight.layout is _STRIDED and norm_weight.layout is _STRIDED):
        for name, t in (("x", x), ("norm_weight", norm_weight), ("weight", weight)):
            check_tensor(_OP, name, t)
    if bias is not None or out is not None:
        check_tensor(_OP, "bias", bias, optional=True)
        check_tensor(_OP, "out", out, optional=True)
    if _grad_enabled() and (x.requires_grad or weight.requires_grad or norm_weight.requires_grad
                            or (bias is not None and bias.requires_grad)
                            or (out is not None and out.requires_grad)):
        check_no_grad(_OP, {"x": x, "norm_weight": norm_weight, "weight": weight, "bias": bias, "out": out})
    if type(eps) is not float or not 0.0 < eps < _INF:
        check_real(_OP, "eps", eps, low=0.0, low_inclusive=False)
    if type(swiglu) is not bool:
        raise ContractError(_OP, "swiglu", f"expected a bool, got {type(swiglu).__name__}")
    form = "[2d, K={k}] (the gate rows, then the up rows)" if swiglu else "[N, K={k}]"
    t, k, on_cpu = check_projection(_OP, x, weight, form)
    dtype, rows = x.dtype, weight.shape[0]
    if swiglu and rows % 2:
        raise ContractError(_OP, "weight", f"expected {form.format(k=k)}, got {list(weight.shape)}")
    n = rows // 2 if swiglu else rows
    if (norm_weight.dtype is not dtype or ((not norm_weight.is_cpu) if on_cpu else norm_weight.device != x.device)
            or norm_weight.shape != (k,) or not norm_weight.is_contiguous()):
        check_vector(_OP, "norm_weight", norm_weight, x, k, "K = x.shape[1]")
    if bias is not None:
        check_like(_OP, "bias", bias, x)
        if tuple(bias.shape) != (rows,) or not bias.is_contiguous():
            raise ContractError(_OP, "bias", f"expected a contiguous [{rows}] (weight's rows), got "
                                             f"{list(bias.shape)} strides {list(bias.stride())}")
    if out is None:
        out = torch.empty((t, n), dtype=dtype, device=x.device)
    else:
        check_out_like(_OP, out, (t, n), x, "[T, d]" if swiglu else "[T, N]")
        check_disjoint(_OP, "out", out, (("x", x), ("norm_weight", norm_weight), ("weight", weight),
                                         ("bias", bias)))
    if not t or not n:
        return out
    if k == 0:  # no product: the bias (or zeros), through SwiGLU with `swiglu`
        reference(x, norm_weight, weight, bias, eps, swiglu, out)
        return out
    dispatch(SPEC, SPEC.key("cpu" if on_cpu else device_type(x), dtype, has_bias=bias is not None, swiglu=swiglu,
                            m=t, n=n, k=k),
             x, norm_weight, weight, bias, eps, swiglu, out)
    return out


SPECS = (SPEC,)

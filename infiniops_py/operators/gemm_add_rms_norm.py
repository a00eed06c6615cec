"""GemmAddRmsNorm: a projection, then the residual add and the next RMSNorm of a pre-norm block, as one operator:
``y = x @ weight.T + bias``, then vLLM's ``fused_add_rms_norm(y, residual, norm_weight, eps)`` (``residual <- y +
residual``; ``out = rms_norm(residual) * norm_weight``), so that a provider can run the add and the norm in the
projection's epilogue (CODA's ``gemm_residual_rmsnorm`` epilogue; issue #23: the o and down projections of a decoder
layer, Mamba-2's ``out_proj``) instead of writing ``y`` out and launching the norm.

Public: gemm_add_rms_norm(x, weight, residual, norm_weight, eps=1e-6, *, bias=None, out=None) -> (out, residual).
Implementation calling convention: fn(x, weight, bias, residual, norm_weight, eps, out) -> None; x [T, K] (last
  stride 1, rows strided), weight [N, K] (the nn.Linear layout, last stride 1), bias None or [N] contiguous,
  residual [T, N] (last stride 1, rows strided) updated in place, norm_weight [N] contiguous, out [T, N]
  contiguous; one dtype, no two of them sharing memory. The rounding is that of `gemm` then `fused_add_rms_norm`:
  the projection accumulated in fp32 (with its bias) and rounded to the dtype, the sum rounded to the dtype, its
  mean square in fp32, the normalized value rounded to the dtype, then times the norm weight, rounded.
Problem fields: has_bias (bool), hidden_size (N: a model's hidden size, as RmsNorm's field).
Size bucket: m, k, the `size_class` of T and K.
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
    check_last_stride,
    check_like,
    check_no_grad,
    check_out_like,
    check_projection,
    check_real,
    check_tensor,
    check_vector,
    check_writable,
    device_type,
)
from infiniops_py.operators._declare import GIVEN, Operator, Overload, sample_tensor
from infiniops_py.operators.rms_norm import fused_reference

__all__ = ["SPECS", "gemm_add_rms_norm", "reference"]

_OP = "gemm_add_rms_norm"
_INF = math.inf
_Tensor = torch.Tensor
_STRIDED = torch.strided  # a sparse or MKLDNN tensor is refused by check_tensor (issue #30)
_grad_enabled = torch.is_grad_enabled


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor,
              norm_weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """Literal reference: the projection in float32 (float64 for float64), rounded to the dtype, then
    `fused_add_rms_norm`'s reference on it and `residual`, the normed rows copied to `out`."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    projected = F.linear(x.to(acc), weight.to(acc), None if bias is None else bias.to(acc)).to(x.dtype)
    fused_reference(projected, residual, norm_weight, eps)
    out.copy_(projected)


def sample_inputs(values: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                  generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``x [m, k]``, the weight ``[n, k]`` scaled by ``k ** -0.5``, a residual ``[m, n]``, a norm weight near 1
    and, with ``has_bias``, an ``[n]`` bias (the tuner's call; ``n`` is ``hidden_size``)."""
    m, n, k = values["m"], values["hidden_size"], values["k"]
    x = sample_tensor(generator, m, k, dtype=dtype, device=device)
    weight = sample_tensor(generator, n, k, dtype=dtype, device=device, scale=k ** -0.5)
    residual = sample_tensor(generator, m, n, dtype=dtype, device=device)
    norm_weight = 1 + sample_tensor(generator, n, dtype=dtype, device=device, scale=0.1)
    bias = sample_tensor(generator, n, dtype=dtype, device=device) if values["has_bias"] else None
    return (x, weight, residual, norm_weight, 1e-6), {"bias": bias}


SPEC = Operator(
    name=_OP,
    fields={"has_bias": False, "hidden_size": 4096},
    buckets=("m", "k"),
    reference=reference,
    doc="residual += x @ weight.T + bias; out = rms_norm(residual): a projection and the next add + RmsNorm in one",
    overloads=(Overload(when={"out": None}, returns=("residual",),
                        fake=lambda x, weight, residual, norm_weight, eps, bias: residual.new_empty(residual.shape)),
               Overload("out", when={"out": GIVEN}, outputs=0, returns=("out", "residual"))),
    mutates=("residual", "out"),
    sizes={"m": (1, 7, 64), "k": (16, 256, 1024)},
    sample_inputs=sample_inputs,
)


@SPEC.define
def gemm_add_rms_norm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                      eps: float = 1e-6, *, bias: torch.Tensor | None = None,
                      out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual <- x @ weight.T + bias + residual``, then ``out = rms_norm(residual) * norm_weight``.

    Equal to ``fused_add_rms_norm(gemm(x, weight, bias=bias, trans_b=True), residual, norm_weight, eps)`` in value
    and rounding (vLLM's ``fused_add_rms_norm(input, residual, weight, eps)`` of the projection's output: the normed
    rows, and the residual updated in place), the projection never written out.

    Args:
        x: ``[T, K]`` float16/bfloat16/float32/float64, last stride 1 (rows may be strided).
        weight: ``[N, K]`` of x's dtype and device, last stride 1 (the ``nn.Linear`` layout).
        residual: ``[T, N]`` of x's dtype and device, last stride 1 (rows may be strided), written in place.
        norm_weight: ``[N]`` contiguous, of x's dtype and device.
        eps: added to the mean square, a finite number > 0.
        bias: optional ``[N]`` contiguous, of x's dtype and device.
        out: optional contiguous ``[T, N]`` of x's dtype and device.

    Returns:
        ``(out, residual)``: `out` (or a new contiguous ``[T, N]`` tensor) holding the normed rows, and `residual`.

    Raises:
        ContractError: a non-tensor or a tensor of another layout than strided; a dim, shape, dtype, device or
            stride other than the above (a K that differs from x's, an N that differs from the residual's); a bad
            `eps`; any two of the tensors sharing memory; a tensor that requires grad while grad mode is on (there
            is no backward). Every check runs before `residual` is written.
    """
    # The checks run on every call (benchmarks/host_overhead.py times them): each attribute is read once, and
    # a helper is only called to raise.
    if not (isinstance(x, _Tensor) and isinstance(weight, _Tensor) and isinstance(residual, _Tensor)
            and isinstance(norm_weight, _Tensor) and x.layout is _STRIDED and weight.layout is _STRIDED
            and residual.layout is _STRIDED and norm_weight.layout is _STRIDED):
        for name, t in (("x", x), ("weight", weight), ("residual", residual), ("norm_weight", norm_weight)):
            check_tensor(_OP, name, t)
    if bias is not None or out is not None:
        check_tensor(_OP, "bias", bias, optional=True)
        check_tensor(_OP, "out", out, optional=True)
    if _grad_enabled() and (x.requires_grad or weight.requires_grad or residual.requires_grad
                            or norm_weight.requires_grad or (bias is not None and bias.requires_grad)
                            or (out is not None and out.requires_grad)):
        check_no_grad(_OP, {"x": x, "weight": weight, "residual": residual, "norm_weight": norm_weight,
                            "bias": bias, "out": out})
    if type(eps) is not float or not 0.0 < eps < _INF:  # an int (even past int64) goes on as its float
        eps = check_real(_OP, "eps", eps, low=0.0, low_inclusive=False)
    t, k, on_cpu = check_projection(_OP, x, weight)
    dtype, n = x.dtype, weight.shape[0]
    if residual.dtype is not dtype or ((not residual.is_cpu) if on_cpu else residual.device != x.device):
        check_like(_OP, "residual", residual, x)
    if tuple(residual.shape) != (t, n):
        raise ContractError(_OP, "residual", f"expected [T={t}, N={n}] (x's rows, weight's rows), got "
                                             f"{list(residual.shape)}")
    if n > 1 and residual.stride(1) != 1:
        check_last_stride(_OP, "residual", residual)
    if (norm_weight.dtype is not dtype or ((not norm_weight.is_cpu) if on_cpu else norm_weight.device != x.device)
            or norm_weight.shape != (n,) or not norm_weight.is_contiguous()):
        check_vector(_OP, "norm_weight", norm_weight, x, n, "N = weight.shape[0]")
    if bias is not None:
        check_like(_OP, "bias", bias, x)
        if tuple(bias.shape) != (n,) or not bias.is_contiguous():
            raise ContractError(_OP, "bias", f"expected a contiguous [{n}] (N), got {list(bias.shape)} "
                                             f"strides {list(bias.stride())}")
    if out is None:
        out = torch.empty((t, n), dtype=dtype, device=x.device)
    else:
        check_out_like(_OP, out, (t, n), x, "[T, N]")
    _check_disjoint(x, weight, residual, norm_weight, bias, out)
    if not t or not n:
        return out, residual
    if k == 0:  # no product: the bias (or zeros) added to the residual, then the norm
        reference(x, weight, bias, residual, norm_weight, eps, out)
        return out, residual
    dispatch(SPEC, SPEC.key("cpu" if on_cpu else device_type(x), dtype, has_bias=bias is not None, hidden_size=n,
                            m=t, k=k),
             x, weight, bias, residual, norm_weight, eps, out)
    return out, residual


def _check_disjoint(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                    bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """The written tensors (`residual`, `out`) share no memory with each other or with the inputs, and
    `residual` has no self-overlapping (expanded) dims."""
    if residual.numel() and not residual.is_contiguous():
        check_writable(_OP, "residual", residual)
    reads = (("x", x), ("weight", weight), ("norm_weight", norm_weight), ("bias", bias))
    check_disjoint(_OP, "residual", residual, reads)
    check_disjoint(_OP, "out", out, (*reads, ("residual", residual)))


SPECS = (SPEC,)

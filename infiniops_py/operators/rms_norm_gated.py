"""RmsNormGated: per-group RmsNorm with a SiLU gate, Mamba-2's output norm (mamba_ssm's / vLLM's ``rms_norm_gated``).

Public: rms_norm_gated(x, weight, bias=None, z=None, eps=1e-6, group_size=None, norm_before_gate=True,
  *, out=None) -> out.
Implementation calling convention: fn(x, weight, bias, z, eps, group_size, norm_before_gate, out) -> out;
  x 2-D [T, H] (last stride 1, row stride arbitrary), z None or like x (its own row stride), weight [H] and
  bias None or [H] contiguous, all of x's dtype; out 2-D [T, H] contiguous, x's dtype. Everything is computed
  in fp32 (fp64 for float64 input) and rounded once, to the dtype, at the end:
  ``norm_before_gate=False``: ``g = x * silu(z)``, ``out = g * rsqrt(mean_group(g**2) + eps) * weight + bias``;
  ``norm_before_gate=True``: ``out = (x * rsqrt(mean_group(x**2) + eps) * weight + bias) * silu(z)``.
Problem fields: hidden_size (int), group_size (int, divides hidden_size), has_z, has_bias, norm_before_gate
  (bools).
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
    check_bool,
    check_dtype,
    check_last_stride,
    check_like,
    check_no_grad,
    check_no_overlap,
    check_out_like,
    check_real,
    check_tensor,
    check_vector,
    device_type,
    strided,
    wants_grad,
)
from infiniops_py.operators._declare import GIVEN, Operator, Overload, Sampler

__all__ = ["SPECS", "reference", "rms_norm_gated"]

_OP = "rms_norm_gated"
_FLOAT_SET = frozenset(FLOAT_DTYPES)


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor | None, eps: float,
              group_size: int, norm_before_gate: bool, out: torch.Tensor) -> torch.Tensor:
    """Literal reference (mamba_ssm's ``rms_norm_ref`` with ``upcast=True``): fp32 (fp64) throughout, one rounding."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    g = x.to(acc)
    if z is not None and not norm_before_gate:
        g = g * F.silu(z.to(acc))
    grouped = g.unflatten(-1, (-1, group_size))
    y = (grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + eps)).flatten(-2) * weight.to(acc)
    if bias is not None:
        y = y + bias.to(acc)
    if z is not None and norm_before_gate:
        y = y * F.silu(z.to(acc))
    out.copy_(y)
    return out


def sample_inputs(values: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                  generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``x [tokens, hidden_size]``, a weight, a gate z and a bias as the fields ask."""
    r, f = Sampler(generator, dtype, device), values
    t, h = f["tokens"], f["hidden_size"]
    kwargs = {"z": r(t, h) if f["has_z"] else None, "group_size": f["group_size"],
              "norm_before_gate": f["norm_before_gate"]}
    return (r(t, h), r(h), r(h) if f["has_bias"] else None), kwargs


SPEC = Operator(
    sample_inputs=sample_inputs,
    tune_sizes={"tokens": 16},
    name=_OP,
    fields={"hidden_size": 4096, "group_size": 4096, "has_z": True, "has_bias": False, "norm_before_gate": True},
    buckets=("tokens",),
    reference=reference,
    doc="per-group RmsNorm gated by silu(z) before or after (Mamba-2's output norm), fp32 throughout",
    overloads=(Overload(when={"out": None}, fake=lambda x, **_: x.new_empty(x.shape)),
               Overload("out", when={"out": GIVEN}, outputs=0, returns=("out",))),
    mutates=("out",),
)


@SPEC.define
def rms_norm_gated(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    eps: float = 1e-6,
    group_size: int | None = None,
    norm_before_gate: bool = True,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """RmsNorm over groups of `group_size` channels of the last dim, gated by ``silu(z)`` before or after.

    mamba_ssm's ``rmsnorm_fn`` / vLLM's ``rms_norm_gated`` (``layernorm_gated.py``; the ``RMSNormGated`` of a
    Mamba-2 mixer is ``norm_before_gate=False``, ``group_size = d_inner / n_groups``), argument order and
    defaults theirs, the output optional by keyword. Computed in fp32 (fp64 for float64 input), rounded
    once to x's dtype: ``norm_before_gate=False`` normalizes ``x * silu(z)``; True gates the normalized
    ``x * weight + bias`` by ``silu(z)``; ``z=None`` is a plain grouped RmsNorm (with the weight in fp32).

    Args:
        x: ``[..., H]``, dtype float16/bfloat16/float32/float64, last stride 1 (rows may be strided).
        weight: ``[H]``, x's dtype and device, contiguous.
        bias: None or like `weight`.
        z: None or x's shape, dtype and device, last stride 1 (a column slice of a wider buffer is fine).
        eps: added to each group's mean square, a finite number > 0.
        group_size: channels per group, a positive divisor of H; None: H (one group).
        norm_before_gate: a bool, see above.
        out: optional contiguous tensor of x's shape, dtype and device, sharing no memory with another
            argument.

    Returns:
        `out`, or a new contiguous tensor of x's shape.

    Raises:
        ContractError: a non-tensor, rank 0, a mismatched weight/bias/z (shape, dtype, device, layout), a last
            stride other than 1, a `group_size` that does not divide H, a bad `eps`, `norm_before_gate` or
            `out`, or a tensor that requires grad while grad mode is on (there is no backward).
    """
    # The checks run on every call: each attribute is read once and a helper is called only to raise.
    if not (strided(x, weight, bias, z, out) and x is not None and weight is not None):
        check_tensor(_OP, "x", x)
        check_tensor(_OP, "weight", weight)
        for name, t in (("bias", bias), ("z", z), ("out", out)):
            check_tensor(_OP, name, t, optional=True)
    if wants_grad(x, weight, bias, z, out):
        check_no_grad(_OP, {"x": x, "weight": weight, "bias": bias, "z": z, "out": out})
    if type(eps) is not float or not eps > 0.0 or eps - eps != 0.0:  # NaN and +-inf give NaN
        eps = check_real(_OP, "eps", eps, low=0.0, low_inclusive=False)
    if norm_before_gate is not True and norm_before_gate is not False:
        check_bool(_OP, "norm_before_gate", norm_before_gate)
    dtype, shape = x.dtype, x.shape
    if dtype not in _FLOAT_SET:
        check_dtype(_OP, "x", x, FLOAT_DTYPES)
    if not shape:
        raise ContractError(_OP, "x", "expected at least one dim [..., H], got a 0-d tensor")
    h = shape[-1]
    if h > 1 and x.stride(-1) != 1:
        check_last_stride(_OP, "x", x)
    group = _group(group_size, h)
    device = x.device
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and not (t.dtype is dtype and t.device == device and t.shape == (h,)
                                  and (h <= 1 or t.stride(0) == 1)):
            check_vector(_OP, name, t, x, h, "H = x.shape[-1]")
    if z is not None:
        if z.shape != shape:
            raise ContractError(_OP, "z", f"expected shape {list(x.shape)} (same as x), got {list(z.shape)}")
        if z.dtype is not dtype or z.device != device or (h > 1 and z.stride(-1) != 1):
            check_like(_OP, "z", z, x)
            check_last_stride(_OP, "z", z)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    else:
        _check_out(x, out, {"x": x, "weight": weight, "bias": bias, "z": z})
    numel = out.numel()
    if numel == 0:
        return out
    key = SPEC.key("cpu" if x.is_cpu else device_type(x), dtype, hidden_size=h, group_size=group,
                   has_z=z is not None, has_bias=bias is not None, norm_before_gate=bool(norm_before_gate),
                   tokens=numel // h)
    dispatch(SPEC, key, _rows(x, h), weight, bias, None if z is None else _rows(z, h), float(eps), group,
             bool(norm_before_gate), out.view(-1, h))
    return out


def _group(group_size: object, h: int) -> int:
    if group_size is None:
        return h
    if type(group_size) is not int or group_size < 1 or (h and h % group_size):
        raise ContractError(_OP, "group_size", f"expected None or a positive int dividing H = {h}, got "
                                               f"{group_size!r}")
    return group_size


def _check_out(x: torch.Tensor, out: torch.Tensor, inputs: dict[str, torch.Tensor | None]) -> None:
    check_out_like(_OP, out, x.shape, x)
    for name, t in inputs.items():
        if t is not None:
            check_no_overlap(_OP, "out", out, name, t)


def _rows(t: torch.Tensor, h: int) -> torch.Tensor:
    """`t` as ``[T, H]``: a view when its leading dims merge into one strided dim, else a copy."""
    if t.dim() == 2:
        return t
    stride = t.stride()
    viewable = all(stride[i] == stride[i + 1] * t.shape[i + 1] or t.shape[i] == 1 for i in range(t.dim() - 2))
    return t.view(-1, h) if viewable else t.reshape(-1, h)


SPECS = (SPEC,)

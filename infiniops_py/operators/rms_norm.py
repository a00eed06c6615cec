"""RmsNorm and fused add + RmsNorm over the last dim (vLLM's ``rms_norm`` semantics).

Public: rms_norm(x, weight, eps=1e-6, *, out=None); fused_add_rms_norm(x, residual, weight, eps=1e-6).
Implementation calling conventions:
  rms_norm: fn(x, weight, eps, out) -> out; x 2-D [T, H] (last stride 1, row stride arbitrary),
    weight [H] same dtype, out 2-D [T, H] contiguous. Variance in fp32; normalized value cast to
    x.dtype, then multiplied by weight.
  fused_add_rms_norm: fn(x, residual, weight, eps) -> None, in place on 2-D [T, H] views:
    residual <- x + residual (rounded to dtype), then x <- rms_norm(residual).
  The public functions return `out` and ``(x, residual)`` whatever the implementation returns.
Problem fields (both): hidden_size (int).
Size bucket (both): tokens, the `size_class` (power of two at or above) of the number of rows T.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from infiniops_py.dispatch import dispatch
from infiniops_py.operators._base import (
    FLOAT_DTYPES,
    ContractError,
    byte_extent,
    check_dtype,
    check_last_stride,
    check_like,
    check_no_grad,
    check_no_overlap,
    check_out_like,
    check_real,
    check_tensor,
    check_vector,
    check_writable,
    device_type,
    overlaps,
    same_view,
)
from infiniops_py.operators._declare import GIVEN, Operator, Overload, sample_tensor

__all__ = ["SPECS", "fused_add_rms_norm", "fused_reference", "reference", "rms_norm"]

_OP = "rms_norm"
_FUSED = "fused_add_rms_norm"
_INF = math.inf
_FLOAT_SET = frozenset(FLOAT_DTYPES)
_Tensor = torch.Tensor
_STRIDED = torch.strided  # a sparse or MKLDNN tensor is refused by check_tensor (issue #30)
_grad_enabled = torch.is_grad_enabled


def _normalize(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf = x.to(acc)
    variance = xf.pow(2).mean(dim=-1, keepdim=True)
    return (xf * torch.rsqrt(variance + eps)).to(x.dtype) * weight


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> torch.Tensor:
    """Literal reference: the mean square in max(float32, dtype), cast to the dtype, times weight."""
    out.copy_(_normalize(x, weight, eps))
    return out


def fused_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """Literal reference: ``residual <- x + residual``; ``x <- rms_norm(residual)``."""
    residual.copy_(x + residual)
    x.copy_(_normalize(residual, weight, eps))


def sample_inputs(values: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                  generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``tokens`` rows of ``hidden_size`` values, a weight near 1 (the tuner's call)."""
    t, h = values["tokens"], values["hidden_size"]
    x = sample_tensor(generator, t, h, dtype=dtype, device=device)
    return (x, 1 + sample_tensor(generator, h, dtype=dtype, device=device, scale=0.1), 1e-6), {}


def fused_sample_inputs(values: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                        generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``x`` and ``residual`` of ``tokens`` rows of ``hidden_size`` values, a weight near 1 (the tuner's call)."""
    t, h = values["tokens"], values["hidden_size"]
    x, residual = (sample_tensor(generator, t, h, dtype=dtype, device=device) for _ in range(2))
    return (x, residual, 1 + sample_tensor(generator, h, dtype=dtype, device=device, scale=0.1), 1e-6), {}


SPEC = Operator(
    name=_OP,
    fields={"hidden_size": 4096},
    buckets=("tokens",),
    reference=reference,
    doc="RmsNorm over the last dim, fp32 variance, weight applied in the input dtype",
    overloads=(Overload(when={"out": None}, fake=lambda x, weight, eps: x.new_empty(x.shape)),
               Overload("out", when={"out": GIVEN}, outputs=0, returns=("out",))),
    mutates=("out",),
    sizes={"tokens": (1, 5, 128)},
    sample_inputs=sample_inputs,
)
FUSED_SPEC = Operator(
    name=_FUSED,
    fields={"hidden_size": 4096},
    buckets=("tokens",),
    reference=fused_reference,
    doc="in place: residual += x, then x = rms_norm(residual)",
    overloads=(Overload(outputs=0, returns=("x", "residual")),),
    mutates=("x", "residual"),
    sizes={"tokens": (1, 5, 128)},
    sample_inputs=fused_sample_inputs,
)


@SPEC.define
def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """RmsNorm over the last dim, Llama/HF semantics (``LlamaRMSNorm``; vLLM's ``rms_norm`` kernel).

    ``out = (x / sqrt(mean(x**2, -1) + eps)).to(x.dtype) * weight``, the mean taken in float32 (float64
    for float64 input).

    Args:
        x: ``[..., H]``, dtype float16/bfloat16/float32/float64, last stride 1 (rows may be strided).
        weight: ``[H]``, same dtype and device, contiguous.
        eps: added to the mean square, a finite number > 0 (keeps a zero row finite).
        out: optional contiguous tensor of `x`'s shape, dtype and device; it may be `x` itself (the same
            view) but must not otherwise overlap `x`, and must not overlap `weight`, in memory (by address,
            so also through another storage object over the same buffer).

    Returns:
        `out`, or a new contiguous tensor of `x`'s shape.

    Raises:
        ContractError: a non-tensor, rank 0, a mismatched weight, dtype or device, a last stride other than
            1, a bad `eps` or `out`, or a tensor that requires grad while grad mode is on (there is no
            backward).
    """
    # The checks run on every call (benchmarks/dispatch.py times them, as add.py's): each
    # attribute is read once, and a helper is only called to raise. A non-tensor fails an attribute read
    # (the try costs nothing when nothing is raised) or, duck-typed, a helper's `check_tensor`.
    if type(eps) is not float or not 0.0 < eps < _INF:
        eps = check_real(_OP, "eps", eps, low=0.0, low_inclusive=False)
    try:
        dtype = x.dtype
        if dtype not in _FLOAT_SET or x.layout is not _STRIDED:
            check_tensor(_OP, "x", x)
            check_dtype(_OP, "x", x, FLOAT_DTYPES)
        shape = x.shape
        try:
            h = shape[-1]
        except IndexError:
            raise ContractError(_OP, "x", "expected at least one dim [..., H], got a 0-d tensor") from None
        x_contiguous = x.is_contiguous()
        if not x_contiguous and h > 1 and x.stride(-1) != 1:
            raise ContractError(_OP, "x", f"expected last stride 1, got strides {list(x.stride())}")
        on_cpu = x.is_cpu  # `is_cpu` costs a third of a device comparison
        device = None if on_cpu else x.device
        # a [H] weight is contiguous exactly when its stride is 1 or H <= 1
        if (weight.dtype is not dtype or (not weight.is_cpu if on_cpu else weight.device != device)
                or weight.shape != (h,) or weight.layout is not _STRIDED or not weight.is_contiguous()):
            _check_weight(_OP, weight, x, h)
        if out is None:
            out = torch.empty(shape, dtype=dtype, device=x.device)
        else:
            if (out.shape != shape or out.dtype is not dtype or (not out.is_cpu if on_cpu else out.device != device)
                    or out.layout is not _STRIDED or not out.is_contiguous()):
                _check_out(x, out)
            # Addresses, not storage objects, decide (two `from_numpy` of views of one array are two storages
            # over one buffer): `overlaps` runs only when a byte range meets out's [low, high).
            low = out.data_ptr()
            high = low + out.nbytes  # out is contiguous, and so is weight (both checked above)
            start = weight.data_ptr()
            if start < high and low < start + weight.nbytes:
                check_no_overlap(_OP, "out", out, "weight", weight)
            if out is not x:
                start = x.data_ptr()
                if start < high and low < start + (x.nbytes if x_contiguous else byte_extent(x)):
                    _check_out_overlap(x, out)
        if (x.requires_grad or weight.requires_grad or out.requires_grad) and _grad_enabled():  # cheap test first
            check_no_grad(_OP, {"x": x, "weight": weight, "out": out})
    except AttributeError:
        for name, t in (("x", x), ("weight", weight), ("out", out)):
            check_tensor(_OP, name, t, optional=name == "out")
        raise
    if len(shape) == 2:
        n = shape[0]
        if n and h:
            key = SPEC.key("cpu" if on_cpu else device_type(x), dtype, hidden_size=h, tokens=n)
            dispatch(SPEC, key, x, weight, eps, out)
        return out
    if 0 in shape:
        return out
    key = SPEC.key("cpu" if on_cpu else device_type(x), dtype, hidden_size=h, tokens=x.numel() // h)
    x2 = x.view(-1, h) if _viewable(x) else x.reshape(-1, h)
    dispatch(SPEC, key, x2, weight, eps, out.view(-1, h))
    return out


@FUSED_SPEC.define
def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """In place: ``residual <- x + residual`` (rounded to the dtype), then ``x <- rms_norm(residual)``.

    vLLM's ``fused_add_rms_norm`` semantics (a transformer block's post-attention residual add and norm).
    Every check runs before either tensor is written: a rejected call leaves both untouched.

    Args:
        x: ``[..., H]``, dtype float16/bfloat16/float32/float64, last stride 1, written in place: no
            zero-stride (expanded) or otherwise self-overlapping dims.
        residual: `x`'s shape, dtype and device, last stride 1, written in place like `x`; it must not
            overlap `x` in memory (not even partly, as ``b[:4]`` and ``b[1:5]`` do).
        weight: ``[H]``, same dtype and device, contiguous, not overlapping `x` or `residual`.
        eps: added to the mean square, a finite number > 0.

    Returns:
        ``(x, residual)``, both updated in place.

    Raises:
        ContractError: a non-tensor, a mismatched shape, dtype or device, a last stride other than 1, a bad
            `eps`, an expanded `x` or `residual`, any two of the tensors sharing memory, or a tensor that
            requires grad while grad mode is on.
    """
    # As rms_norm's: each attribute read once, a helper called only to raise, in the order of the arguments.
    if not (isinstance(x, _Tensor) and isinstance(residual, _Tensor) and isinstance(weight, _Tensor)
            and x.layout is _STRIDED and residual.layout is _STRIDED and weight.layout is _STRIDED):
        check_tensor(_FUSED, "x", x)
        check_tensor(_FUSED, "residual", residual)
        check_tensor(_FUSED, "weight", weight)
    if _grad_enabled() and (x.requires_grad or residual.requires_grad or weight.requires_grad):
        check_no_grad(_FUSED, {"x": x, "residual": residual, "weight": weight})
    if type(eps) is not float or not 0.0 < eps < _INF:
        eps = check_real(_FUSED, "eps", eps, low=0.0, low_inclusive=False)
    dtype, shape = x.dtype, x.shape
    if dtype not in _FLOAT_SET or not shape:
        _check_rows(_FUSED, "x", x)
    h = shape[-1]
    x_contiguous = x.is_contiguous()
    if not x_contiguous:
        check_last_stride(_FUSED, "x", x)
    if residual.shape != shape:
        raise ContractError(
            _FUSED, "residual", f"expected shape {list(shape)} (same as x), got {list(residual.shape)}"
        )
    on_cpu = x.is_cpu  # `is_cpu` costs a third of a device comparison
    if residual.dtype is not dtype or ((not residual.is_cpu) if on_cpu else residual.device != x.device):
        check_like(_FUSED, "residual", residual, x)
    r_contiguous = residual.is_contiguous()
    if not r_contiguous:
        check_last_stride(_FUSED, "residual", residual)
    if (weight.dtype is not dtype or ((not weight.is_cpu) if on_cpu else weight.device != x.device)
            or weight.shape != (h,) or not weight.is_contiguous()):
        _check_weight(_FUSED, weight, x, h)
    if 0 in shape:
        return x, residual
    if not x_contiguous:
        check_writable(_FUSED, "x", x)
    if not r_contiguous:
        check_writable(_FUSED, "residual", residual)
    # byte ranges first: `overlaps` runs only when two of them meet (weight is contiguous, checked above)
    x_lo, r_lo, w_lo = x.data_ptr(), residual.data_ptr(), weight.data_ptr()
    x_hi = x_lo + (x.nbytes if x_contiguous else byte_extent(x))
    r_hi = r_lo + (residual.nbytes if r_contiguous else byte_extent(residual))
    w_hi = w_lo + weight.nbytes
    if r_lo < x_hi and x_lo < r_hi:
        check_no_overlap(_FUSED, "residual", residual, "x", x)
    if w_lo < x_hi and x_lo < w_hi:
        check_no_overlap(_FUSED, "weight", weight, "x", x)
    if w_lo < r_hi and r_lo < w_hi:
        check_no_overlap(_FUSED, "weight", weight, "residual", residual)
    key = FUSED_SPEC.key("cpu" if on_cpu else device_type(x), dtype, hidden_size=h, tokens=x.numel() // h)
    if len(shape) == 2:
        dispatch(FUSED_SPEC, key, x, residual, weight, eps)
        return x, residual
    if _viewable(x) and _viewable(residual):
        dispatch(FUSED_SPEC, key, x.view(-1, h), residual.view(-1, h), weight, eps)
        return x, residual
    # Rows that cannot be flattened into one strided dim: run on 2-D copies, then write back in place.
    x2, r2 = x.reshape(-1, h).clone(), residual.reshape(-1, h).clone()
    dispatch(FUSED_SPEC, key, x2, r2, weight, eps)
    x.copy_(x2.view(x.shape))
    residual.copy_(r2.view(x.shape))
    return x, residual


def _check_rows(op: str, name: str, x: torch.Tensor) -> int:
    check_dtype(op, name, x, FLOAT_DTYPES)
    if x.dim() == 0:
        raise ContractError(op, name, "expected at least one dim [..., H], got a 0-d tensor")
    check_last_stride(op, name, x)
    return x.shape[-1]


def _check_weight(op: str, weight: torch.Tensor, x: torch.Tensor, h: int) -> None:
    check_tensor(op, "weight", weight)
    check_vector(op, "weight", weight, x, h, "H = x.shape[-1]")


def _check_out(x: torch.Tensor, out: torch.Tensor) -> None:
    check_tensor(_OP, "out", out)
    check_out_like(_OP, out, x.shape, x)


def _check_out_overlap(x: torch.Tensor, out: torch.Tensor) -> None:
    """`out`'s byte range meets `x`'s: allowed only when `out` is `x`'s very view (in place)."""
    if not same_view(x, out) and overlaps(x, out):
        raise ContractError(_OP, "out", "partially overlaps x; out may share memory with x only as x itself")


def _viewable(x: torch.Tensor) -> bool:
    """Whether the leading dims of `x` merge into one strided dim (so ``x.view(-1, H)`` is a view)."""
    stride = x.stride()
    return all(stride[i] == stride[i + 1] * x.shape[i + 1] or x.shape[i] == 1 for i in range(x.dim() - 2))


SPECS = (SPEC, FUSED_SPEC)

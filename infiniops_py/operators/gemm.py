"""Gemm: y = alpha * op(a) @ op(b) + beta * c + bias (BLAS / ``torch.addmm`` semantics).

Public: gemm(a, b, *, c=None, bias=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, out=None).
Implementation calling convention: fn(a, b, c, bias, alpha, beta, trans_a, trans_b, out) -> out.
  a: [M, K] ([K, M] when trans_a), or with a leading batch dim; b: [K, N] ([N, K] when trans_b, the
  nn.Linear weight layout); c: None when beta == 0 (never read then), else broadcastable to [M, N];
  bias: None or [N]; out: allocated by gemm, [(Bt,) M, N] in a.dtype. fp32 accumulation.
  (gemm hands c over already expanded to out's shape: a view whose strides may be 0.)
Problem fields: batched, trans_a, trans_b, has_bias, has_c (all bool).
Size bucket: m, n, k, the `size_class` (power of two at or above) of M, N and K (per batch entry).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from infiniops_py.dispatch import dispatch
from infiniops_py.operators._base import (
    FLOAT_DTYPES,
    ContractError,
    check_bool,
    check_device,
    check_dtype,
    check_no_grad,
    check_real,
    check_tensor,
    device_type,
    overlaps,
    same_view,
)
from infiniops_py.operators._declare import GIVEN, Operator, Overload, Sampler

__all__ = ["SPECS", "gemm", "reference"]

_OP = "gemm"
_FLOAT_SET = frozenset(FLOAT_DTYPES)
_Tensor = torch.Tensor
_STRIDED = torch.strided  # a sparse or MKLDNN tensor is refused by check_tensor (issue #30)
_grad_enabled = torch.is_grad_enabled


def reference(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None,
    bias: torch.Tensor | None,
    alpha: float,
    beta: float,
    trans_a: bool,
    trans_b: bool,
    out: torch.Tensor,
) -> torch.Tensor:
    """Literal reference, in float32 (float64 for float64 inputs), rounded once into `out`."""
    acc = torch.float64 if a.dtype == torch.float64 else torch.float32
    op_a = a.to(acc).transpose(-1, -2) if trans_a else a.to(acc)
    op_b = b.to(acc).transpose(-1, -2) if trans_b else b.to(acc)
    y = alpha * torch.matmul(op_a, op_b)
    if c is not None:
        y = y + beta * c.to(acc)
    if bias is not None:
        y = y + bias.to(acc)
    out.copy_(y)
    return out


def _fake(a: torch.Tensor, b: torch.Tensor, trans_a: bool, trans_b: bool, **_: object) -> torch.Tensor:
    m = a.shape[-1] if trans_a else a.shape[-2]
    n = b.shape[-2] if trans_b else b.shape[-1]
    return a.new_empty((*a.shape[:-2], m, n))


def sample_inputs(values: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                  generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``a [m, k]`` (``[k, m]`` with trans_a), ``b [k, n]`` (``[n, k]`` with trans_b) scaled by ``k ** -0.5``, a
    leading batch of 2 when batched; a bias ``[n]`` and ``c [m, n]`` (beta 1) when asked."""
    r, f = Sampler(generator, dtype, device), values
    m, n, k = f["m"], f["n"], f["k"]
    lead = (2,) if f["batched"] else ()
    a = r(*lead, *((k, m) if f["trans_a"] else (m, k)))
    b = r(*lead, *((n, k) if f["trans_b"] else (k, n)), scale=k ** -0.5)
    kwargs: dict[str, Any] = {"trans_a": f["trans_a"], "trans_b": f["trans_b"]}
    if f["has_bias"]:
        kwargs["bias"] = r(n)
    if f["has_c"]:
        kwargs.update(c=r(*lead, m, n), beta=1.0)
    return (a, b), kwargs


SPEC = Operator(
    sample_inputs=sample_inputs,
    tune_sizes={"m": 1, "n": 4096, "k": 4096},
    name=_OP,
    fields={"batched": False, "trans_a": False, "trans_b": False, "has_bias": False, "has_c": False},
    buckets=("m", "n", "k"),
    reference=reference,
    doc="y = alpha * op(a) @ op(b) + beta * c + bias, fp32 accumulation, optional batch dim",
    overloads=(Overload(when={"out": None}, fake=_fake),
               Overload("out", when={"out": GIVEN}, outputs=0, returns=("out",))),
    mutates=("out",),
)


@SPEC.define
def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    c: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    trans_a: bool = False,
    trans_b: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``y = alpha * op(a) @ op(b) + beta * c + bias``, accumulated in fp32 (BLAS / ``torch.addmm`` semantics).

    Args:
        a: ``[M, K]``, or ``[K, M]`` when `trans_a`; optionally with a leading batch dim ``[Bt, ...]``.
            dtype float16/bfloat16/float32/float64. Row- or column-major in its last two dims (one of
            their strides is 1), like every BLAS operand.
        b: ``[K, N]``, or ``[N, K]`` when `trans_b` (the ``nn.Linear`` weight layout); batched exactly
            when `a` is, with the same ``Bt``; same dtype and device as `a`, row- or column-major.
        c: optional, broadcastable to ``[(Bt,) M, N]``, same dtype. When ``beta == 0`` it is never read,
            so NaN/Inf in `c` does not reach the result (``torch.addmm`` semantics).
        bias: optional ``[N]``, same dtype, added to every row.
        alpha, beta: finite real numbers (int or float, not bool).
        trans_a, trans_b: use the transpose of `a` / `b` (bools).
        out: optional contiguous ``[(Bt,) M, N]`` in `a`'s dtype; it may be `c` itself (same shape and
            view: in-place accumulation) but must not otherwise share memory with `a`, `b`, `bias` or `c`
            (`c` even when ``beta == 0``), by address, whatever storage objects they are; sharing their
            storage without sharing elements is fine.

    Returns:
        `out`, or a new contiguous ``[(Bt,) M, N]`` tensor in `a`'s dtype.

    Raises:
        ContractError: a non-tensor, a bad scalar, a rank, shape, dtype, device or stride that breaks the
            above, or a tensor that requires grad while grad mode is on (there is no backward), naming the
            argument.
    """
    # The checks run on every call (benchmarks/host_overhead.py times them): each attribute is read once, and
    # a helper is only called to raise; the order of the checks is that of the docstring's arguments.
    if not (isinstance(a, _Tensor) and isinstance(b, _Tensor) and a.layout is _STRIDED and b.layout is _STRIDED):
        check_tensor(_OP, "a", a)
        check_tensor(_OP, "b", b)
    if c is not None or bias is not None or out is not None:
        for name, t in (("c", c), ("bias", bias), ("out", out)):
            if t is not None and not (isinstance(t, _Tensor) and t.layout is _STRIDED):
                check_tensor(_OP, name, t, optional=True)
    if _grad_enabled() and (a.requires_grad or b.requires_grad or (c is not None and c.requires_grad)
                            or (bias is not None and bias.requires_grad) or (out is not None and out.requires_grad)):
        check_no_grad(_OP, {"a": a, "b": b, "c": c, "bias": bias, "out": out})
    if type(alpha) is not float or alpha - alpha != 0.0:  # NaN and +-inf give NaN
        alpha = check_real(_OP, "alpha", alpha)  # as a float: an int beyond int64 would overflow in torch
    if type(beta) is not float or beta - beta != 0.0:
        beta = check_real(_OP, "beta", beta)
    if trans_a is not True and trans_a is not False:
        check_bool(_OP, "trans_a", trans_a)
    if trans_b is not True and trans_b is not False:
        check_bool(_OP, "trans_b", trans_b)
    dt = a.dtype
    if dt not in _FLOAT_SET:
        check_dtype(_OP, "a", a, FLOAT_DTYPES)
    on_cpu = a.is_cpu  # `is_cpu` costs a third of a device comparison
    if b.dtype is not dt or ((not b.is_cpu) if on_cpu else not (b.is_cuda and b.get_device() == a.get_device())
                             and b.device != a.device):  # on CUDA two ints compare cheaper than two devices
        _check_operand("b", b, dt, a.device)
    sa, sb = a.shape, b.shape
    rank = len(sa)
    if rank != 2 and rank != 3:
        raise ContractError(_OP, "a", f"expected rank 2 [M, K] or 3 [Bt, M, K], got shape {list(sa)}")
    if len(sb) != rank:
        raise ContractError(_OP, "b", f"expected rank {rank} (same as a), got shape {list(sb)}")
    batched = rank == 3
    m, ka = (sa[-1], sa[-2]) if trans_a else (sa[-2], sa[-1])
    kb, n = (sb[-1], sb[-2]) if trans_b else (sb[-2], sb[-1])
    if kb != ka:
        want = "[N, K]" if trans_b else "[K, N]"
        raise ContractError(_OP, "b", f"expected {want} with K={ka} (from a), got shape {list(sb)}")
    if batched and sb[0] != sa[0]:
        raise ContractError(_OP, "b", f"expected batch {sa[0]} (same as a), got shape {list(sb)}")
    _check_major("a", a, sa)
    _check_major("b", b, sb)
    shape = (sa[0], m, n) if batched else (m, n)
    if bias is not None:
        if bias.dtype is not dt or ((not bias.is_cpu) if on_cpu else bias.device != a.device):
            _check_operand("bias", bias, dt, a.device)
        if bias.shape != (n,):
            raise ContractError(_OP, "bias", f"expected shape [{n}] (N), got {list(bias.shape)}")
    c_full = None
    if c is not None:
        _check_operand("c", c, dt, a.device)
        try:
            c_full = c.expand(shape)
        except RuntimeError:
            raise ContractError(_OP, "c", f"shape {list(c.shape)} does not broadcast to {list(shape)}") from None
        c = c_full if beta != 0 else None
    if out is None:
        out = torch.empty(*shape, dtype=dt, device=a.device)  # sizes as ints parse faster than a tuple
        if not (m and n and (not batched or shape[0])):
            return out
    else:  # c is checked even when beta == 0: it is not read then, but out must not write into it
        _check_out(out, shape, a, b, bias, c_full)
        if out.numel() == 0:
            return out
    key = SPEC.key("cpu" if on_cpu else device_type(a), dt, batched=batched, trans_a=trans_a, trans_b=trans_b,
                   has_bias=bias is not None, has_c=c is not None, m=m, n=n, k=ka)
    dispatch(SPEC, key, a, b, c, bias, alpha, beta, trans_a, trans_b, out)
    return out


def _check_operand(name: str, t: torch.Tensor, dtype: torch.dtype, device: torch.device) -> None:
    if t.dtype != dtype:
        raise ContractError(_OP, name, f"expected dtype {dtype} (same as a), got {t.dtype}")
    check_device(_OP, name, t, device)


def _check_major(name: str, t: torch.Tensor, shape: torch.Size) -> None:
    """BLAS operands need a unit stride in one of their last two dims (a dim of size 1 has any stride)."""
    rows, cols = shape[-2], shape[-1]
    if rows == 1 or cols == 1:
        return
    rs, cs = t.stride()[-2:]
    if not (cs == 1 or rs == 1):
        raise ContractError(
            _OP, name, f"strides {list(t.stride())} have no unit stride in the last two dims; "
            "pass a row- or column-major matrix (e.g. .contiguous())"
        )


def _check_out(
    out: torch.Tensor,
    shape: tuple[int, ...],
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    c: torch.Tensor | None,
) -> None:
    if tuple(out.shape) != shape:
        raise ContractError(_OP, "out", f"expected shape {list(shape)}, got {list(out.shape)}")
    if out.dtype != a.dtype:
        raise ContractError(_OP, "out", f"expected dtype {a.dtype} (same as a), got {out.dtype}")
    check_device(_OP, "out", out, a.device)
    if not out.is_contiguous():
        raise ContractError(_OP, "out", f"expected a contiguous tensor, got strides {list(out.stride())}")
    for name, t in (("a", a), ("b", b), ("bias", bias), ("c", c)):
        if t is None or (name == "c" and same_view(t, out)) or not overlaps(t, out):
            continue
        raise ContractError(_OP, "out", f"shares memory with {name}; only out=c (the same full view) may alias")


SPECS = (SPEC,)

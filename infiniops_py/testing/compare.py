"""Comparing an output against its float64 reference with one entry of the tolerance table.

Comparisons run in float64 on the reference's device (the CPU, or the GPU for large cases: see
`conformance`). Every comparison returns the largest absolute error it saw and, when the output fails, one line saying
which elements are off, the worst one, and the rule it broke. NaN never passes unless the reference is
NaN at the same place; infinities must match exactly.
"""

from __future__ import annotations

from typing import Final

import torch

from infiniops_py.testing.tolerances import Allclose, LowPrecisionRule

__all__ = ["Outcome", "bits_equal", "compare"]

Outcome = tuple[float, str | None]  # (max abs error, failure message or None)

_INT_OF_SIZE: Final = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `a` and `b` have the same shape, dtype and bits (NaN payloads and signed zeros included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.device != b.device:
        a, b = a.cpu(), b.cpu()
    as_int = _INT_OF_SIZE.get(a.element_size()) if a.is_floating_point() else None
    if as_int is None:
        return torch.equal(a, b)
    return torch.equal(a.detach().contiguous().view(as_int), b.detach().contiguous().view(as_int))


def compare(label: str, got: torch.Tensor, ref: torch.Tensor, tol: Allclose | LowPrecisionRule, *,
            k: int | None = None, low: torch.Tensor | None = None, exact: bool = False) -> Outcome:
    """Compare `got` (any device and dtype) with `ref` (the float64 reference), on `ref`'s device.

    Args:
        label: names the output in the message (``result``, ``mutated 'x'``).
        tol: the table entry; `exact` overrides it with bit-for-bit equality to the reference's value.
        k: the reduction length, needed when ``tol.atol_per_k`` is set.
        low: for `LowPrecisionRule`, the same reference run in the input's own dtype.
    """
    if tuple(got.shape) != tuple(ref.shape):
        return float("inf"), f"{label}: shape {list(got.shape)}, expected {list(ref.shape)}"
    g = got.detach().to(ref.device, torch.float64)
    r = ref.detach().to(torch.float64)
    if g.numel() == 0:
        return 0.0, None
    diff = (g - r).abs()
    same = (g == r) | (g.isnan() & r.isnan())
    err = torch.where(same, 0.0, diff.nan_to_num(nan=float("inf")))
    worst = float(err.max())
    if exact or (isinstance(tol, Allclose) and tol == Allclose(0.0, 0.0)):
        return worst, _report(label, g, r, ~same, "bit-for-bit equality") if not bool(same.all()) else None
    if isinstance(tol, LowPrecisionRule):
        return worst, _low_precision(label, g, r, same, worst, tol, low)
    if tol.atol_per_k and k is None:
        return worst, f"{label}: the tolerance needs the reduction length K, but the case sets no Case.k"
    atol = tol.atol + tol.atol_per_k * (k or 0)
    ok = same | (diff <= atol + tol.rtol * r.abs())
    if bool(ok.all()):
        return worst, None
    return worst, _report(label, g, r, ~ok, f"rtol={tol.rtol:g}, atol={atol:g}")


def _low_precision(label: str, g: torch.Tensor, r: torch.Tensor, same: torch.Tensor, worst: float,
                   tol: LowPrecisionRule, low: torch.Tensor | None) -> str | None:
    if low is None:
        return f"{label}: the low-precision rule needs the reference run in the input dtype"
    nan_off = g.isnan() != r.isnan()
    if bool(nan_off.any()):
        return _report(label, g, r, nan_off, "NaN where the reference is not (or the reverse)")
    lo = low.detach().to(r.device, torch.float64)
    low_err = torch.where(lo.isfinite() & r.isfinite(), (lo - r).abs(), 0.0)
    allowed = tol.factor * float(low_err.max()) + tol.atol
    if worst <= allowed:
        return None
    rule = f"max |err| <= {tol.factor:g} x {float(low_err.max()):.3g} (the reference's own error in the input dtype)" \
           f" + {tol.atol:g} = {allowed:.3g}"
    return _report(label, g, r, ~same & ((g - r).abs().nan_to_num(nan=float("inf")) > allowed), rule)


def _report(label: str, g: torch.Tensor, r: torch.Tensor, bad: torch.Tensor, rule: str) -> str:
    n_bad = int(bad.sum())
    err = torch.where(bad, (g - r).abs().nan_to_num(nan=float("inf")), -1.0)
    flat = int(err.argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), g.shape)) if g.dim() else ()
    return (f"{label}: {n_bad}/{g.numel()} elements break {rule}; worst at {list(index)}: "
            f"got {float(g.reshape(-1)[flat]):.6g}, expected {float(r.reshape(-1)[flat]):.6g}")

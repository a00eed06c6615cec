"""Synthetic inputs of a problem bucket's representative size, for the tuner and ``infiniops tune``.

`build` returns one public-function call (`SyntheticCall`) whose problem has the given fields and whose sizes
fall in the given bucket: the tuner records the implementation call it makes and times each accepting
implementation on it. Every call comes from the operator's own declaration, ``Operator.sample_inputs`` (seeded
standard-normal values, the layout the conformance suite checks), at the sizes asked for, the rest at
``Operator.tune_sizes`` (else the largest of ``Operator.sizes``).

`SIZES` names, per operator, the sizes its ``sample_inputs`` takes and their defaults: the bucket's sizes
(``OpSpec.buckets``) and the extra ones that fix the shape (the attention's KV heads, the conv's channels, the
rotary's heads). Every problem field of every operator with a size bucket has its sample (an fp8 cache comes with
its scales, ALiBi with its slopes, a packed conv or scan with its sequence boundaries); ``all_reduce`` has no
bucket (a collective is timed on every rank together or not at all), so `build` refuses it with a `ValueError`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import torch

from infiniops_py.operators import OPERATORS
from infiniops_py.problem import dtype_name

__all__ = ["SIZES", "SyntheticCall", "build"]

SIZES: Final[dict[str, dict[str, int]]] = {
    name: dict(spec.tune_sizes) or {size: max(drawn) for size, drawn in spec.sizes.items()}
    for name, spec in OPERATORS.items() if getattr(spec, "sample_inputs", None) is not None}


@dataclass
class SyntheticCall:
    """``function(*args, **kwargs)``: a public operator call; `sizes` are the sizes it was built at."""

    function: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)

    def run(self) -> Any:
        """Make the call (under ``torch.inference_mode``)."""
        with torch.inference_mode():
            return self.function(*self.args, **self.kwargs)


def build(op: str, *, device: str, dtype: str | torch.dtype, sizes: Mapping[str, int],
          fields: Mapping[str, Any]) -> SyntheticCall:
    """A call of operator `op` on `device` in `dtype` with problem `fields` (the rest take the operator's
    defaults) at `sizes` (missing ones take `SIZES`' defaults).

    Raises:
        KeyError: an unknown operator. ValueError: an operator without a size bucket (``all_reduce``), a size
            or a size field (one whose default is an int >= 1: ``hidden_size``) that is not an int >= 1, a
            name that is neither a size of `op` (`SIZES`) nor a field, an unknown dtype or device, or inputs
            that cannot be allocated (naming the sizes).
        ContractError: fields that cannot go together (the operator's own checks name them).
    """
    if op not in OPERATORS:
        raise KeyError(f"unknown operator {op!r}; known: {', '.join(OPERATORS)}")
    if op not in SIZES:
        raise ValueError(f"{op} has no size bucket: nothing to tune (a collective is timed on all its ranks "
                         "together, which the tuner does not do)")
    unknown = set(sizes) - set(SIZES[op])
    if unknown:
        raise ValueError(f"{op}: unknown size(s) {sorted(unknown)}; its sizes: {', '.join(SIZES[op])}")
    spec = OPERATORS[op]
    unknown = set(fields) - set(spec.fields)
    if unknown:
        raise ValueError(f"{op}: unknown problem field(s) {sorted(unknown)}; known: {sorted(spec.fields)}")
    full = {**SIZES[op], **sizes}
    for name, n in full.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{op}: size {name}={n!r} must be an int >= 1")
    for name, value in fields.items():  # a size among the fields (hidden_size, head_dim): 0 builds empty inputs,
        default = spec.fields[name]     # which time nothing (issue #30, item 10)
        if _is_size(default) and (not _is_size(value) or value < 1):
            raise ValueError(f"{op}: field {name}={value!r} must be an int >= 1 (a size; its default is {default})")
    values = {**spec.fields, **fields}
    dt = getattr(torch, dtype_name(dtype), None) if isinstance(dtype, str) else dtype
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r} (float32, bfloat16, float16, ...)")
    try:
        torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r} (cpu, cuda, cuda:1, ...)") from None
    try:  # a size it draws may be a field: one given by name wins
        args, kwargs = spec.sample_inputs({**values, **SIZES[op], **fields, **sizes}, dt, torch.device(device),
                                          torch.Generator().manual_seed(0))
    except (RuntimeError, MemoryError) as err:  # an allocation the device refuses
        raise ValueError(f"{op}: cannot make the inputs of sizes {full} on {device}: {err}") from None
    return SyntheticCall(spec.function, tuple(args), dict(kwargs), full)


def _is_size(value: Any) -> bool:
    """Whether a field's `value` is an int >= 1 (not a bool): the default of a size field, such as
    ``hidden_size`` or ``head_dim`` (a field whose default is 0, such as ``block_size`` 0, is a switch)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1

"""The capability matrix as data: a `Matrix` of rows (operator, provider) of cells (device, dtype), built by
`build` from the providers the runtime knows, evaluating only the static constraints."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from infiniops_py import runtime
from infiniops_py.capability import ComputeCapability, CudaAvailable, constraint_text, safe_reject
from infiniops_py.operators import OPERATORS
from infiniops_py.registry import Implementation, Provider

__all__ = ["DEVICES", "DTYPES", "Cell", "Matrix", "ProviderInfo", "Row", "build"]

DEVICES: Final = ("cpu", "cuda")
DTYPES: Final = ("float16", "bfloat16", "float32", "float64")
_KEYS: Final = ("device_type", "dtype")
_WHERE: Final = re.compile(r" \(at [^()]*:\d+\)$")  # a traceback location: machine-specific


@dataclass(frozen=True)
class Cell:
    """One (device, dtype) of one provider's row: served by `implementations`, or gated for `reasons`."""

    device: str
    dtype: str
    served: bool
    implementations: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()

    def text(self) -> str:
        """``served``, or ``gated: `` and the reasons joined by ``; ``."""
        return "served" if self.served else "gated: " + "; ".join(self.reasons)


@dataclass(frozen=True)
class Row:
    """One provider for one operator: its cells, each implementation's other limits, and the minimum CUDA
    compute capability its implementations need (``"8.0"``; empty when none states one)."""

    op: str
    provider: str
    cells: tuple[Cell, ...]
    limits: tuple[str, ...]
    compute_capability: tuple[str, ...] = ()

    def limits_text(self) -> str:
        """The limits joined by ``; ``, or ``-`` when there are none."""
        return "; ".join(self.limits) or "-"

    def compute_capability_text(self) -> str:
        """``>= 8.0`` per minimum compute capability, joined by ``, ``, or ``-`` when none is stated."""
        return ", ".join(f">= {cc}" for cc in self.compute_capability) or "-"

    @property
    def implemented(self) -> bool:
        """Whether the provider implements the operator (a row added by ``unimplemented=True`` does not)."""
        return bool(self.limits)


@dataclass(frozen=True)
class ProviderInfo:
    """A provider as the matrix lists it: name, version, where it came from, and its load error ('' if loaded)."""

    name: str
    version: str
    source: str
    error: str


@dataclass(frozen=True)
class Matrix:
    """The devices and dtypes of the columns, the providers, the operators (name, doc) and the rows."""

    devices: tuple[str, ...]
    dtypes: tuple[str, ...]
    providers: tuple[ProviderInfo, ...]
    operators: tuple[tuple[str, str], ...]  # (name, doc)
    rows: tuple[Row, ...]

    def rows_of(self, op: str) -> list[Row]:
        """The rows of operator `op`, in provider order (the last-resort ``reference`` last)."""
        return [r for r in self.rows if r.op == op]


def _provider_order(p: Provider) -> tuple[bool, str]:
    return (p.name == "reference", p.name)  # the last resort last


def _static_rejections(impl: Implementation, device: str, dtype: str) -> list[str]:
    problem = OPERATORS[impl.op].problem(device, dtype)
    found = []
    for c in impl.capability.constraints:
        if c.environmental or c.field not in _KEYS:
            continue
        r = safe_reject(c, problem)
        if r is not None:
            found.append(f"{r.field}={r.found} {r.allowed}")
    return found


def _limits(impl: Implementation) -> str:
    parts = [constraint_text(c) for c in impl.capability.constraints if not c.environmental and c.field not in _KEYS]
    # every cuda cell needs a CUDA device (the intro says so): listing it on each row is noise; the compute
    # capability has its own column
    parts += [constraint_text(c) for c in impl.capability.constraints
              if c.environmental and not isinstance(c, CudaAvailable | ComputeCapability)]
    return f"{impl.name}: " + (", ".join(parts) if parts else "no other limits")


def _compute_capability(impls: Sequence[Implementation]) -> tuple[str, ...]:
    found = {c.minimum for i in impls for c in i.capability.constraints if isinstance(c, ComputeCapability)}
    return tuple(f"{major}.{minor}" for major, minor in sorted(found))


def _cell(impls: Sequence[Implementation], device: str, dtype: str) -> Cell:
    if not impls:
        return Cell(device, dtype, False, reasons=("no implementation",))
    serving, reasons = [], []
    for impl in impls:
        rejected = _static_rejections(impl, device, dtype)
        if rejected:
            reasons.extend(r for r in rejected if r not in reasons)
        else:
            serving.append(impl.name)
    if serving:
        return Cell(device, dtype, True, implementations=tuple(sorted(serving)))
    return Cell(device, dtype, False, reasons=tuple(reasons))


def build(*, ops: Sequence[str] | None = None, devices: Sequence[str] = DEVICES,
          dtypes: Sequence[str] = DTYPES, unimplemented: bool = False) -> Matrix:
    """The matrix of the providers the runtime knows (``INFINIOPS_PROVIDERS`` applies).

    Args:
        ops: the operators (default: all, in `OPERATORS` order).
        devices, dtypes: the columns.
        unimplemented: also a row, all cells gated ("no implementation"), for each loaded provider that
            does not implement an operator.

    Raises:
        KeyError: an unknown operator in `ops`.
    """
    for op in ops or ():
        if op not in OPERATORS:
            raise KeyError(f"unknown operator {op!r}; known: {', '.join(OPERATORS)}")
    providers = sorted(runtime.providers(), key=_provider_order)
    infos = tuple(ProviderInfo(p.name, p.version, p.source, _WHERE.sub("", p.error)) for p in providers)
    names = [op for op in OPERATORS if ops is None or op in ops]
    rows = []
    for op in names:
        for p in providers:
            if not p.loaded:
                continue
            impls = sorted((i for i in p.implementations if i.op == op), key=lambda i: i.name)
            if not impls and not unimplemented:
                continue
            cells = tuple(_cell(impls, dev, dt) for dev in devices for dt in dtypes)
            rows.append(Row(op, p.name, cells, tuple(_limits(i) for i in impls), _compute_capability(impls)))
    return Matrix(tuple(devices), tuple(dtypes), infos, tuple((op, OPERATORS[op].doc) for op in names), tuple(rows))

"""Gate checks: every problem outside a provider's declared capability is rejected with a `GateError`.

For each static `OneOf`, `Between` and `MultipleOf` constraint of each implementation, the check builds
problems whose constrained field takes values outside the allowed set (the other fields keep the
operator's defaults), and, unless a sibling implementation of the same provider accepts the problem,
asserts that ``resolve()`` under ``use(provider)`` raises `GateError` naming that field. The values come
from a universe per field: the default, every value any provider declares for it, and a fixed set of
devices, dtypes and sizes (odd head dims, non-powers of two, zero).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from infiniops_py import runtime
from infiniops_py.capability import Between, Constraint, MultipleOf, OneOf
from infiniops_py.errors import GateError
from infiniops_py.operators import OPERATORS
from infiniops_py.problem import OpSpec
from infiniops_py.registry import Implementation
from infiniops_py.resolver import use

__all__ = ["GateFailure", "GateReport", "check_gates", "outside_values"]

_DEVICES: Final = ("cpu", "cuda", "mps", "xpu")
_DTYPES: Final = ("float16", "bfloat16", "float32", "float64")
_SIZES: Final = (0, 1, 2, 3, 4, 5, 7, 8, 16, 24, 32, 48, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256, 300, 512,
                 1024)


@dataclass(frozen=True)
class GateFailure:
    """A problem outside the capability that the resolver did not reject with a `GateError` naming the field."""

    op: str
    implementation: str
    constraint: str
    problem: str
    message: str

    def __str__(self) -> str:
        return f"{self.op} ({self.implementation}, constraint '{self.constraint}') {self.problem}: {self.message}"


@dataclass
class GateReport:
    checked: int = 0
    failures: list[GateFailure] = field(default_factory=list)


def _sort_key(value: Any) -> tuple[str, Any]:
    return (type(value).__name__, value)


def _universe(spec: OpSpec, name: str, impls: Sequence[Implementation]) -> list[Any]:
    if name == "device_type":
        return list(_DEVICES)
    if name == "dtype":
        return list(_DTYPES)
    default = spec.fields[name]
    values = {default}
    for impl in impls:
        for c in impl.capability.constraints:
            if isinstance(c, OneOf) and c.field == name:
                values |= c.values
    if isinstance(default, bool):
        values |= {False, True}
    elif isinstance(default, int):
        values |= set(_SIZES)
    elif isinstance(default, float):
        values |= {0.0, 0.5, 1.0, 2.0}
    return sorted(values, key=_sort_key)


def outside_values(c: Constraint, universe: Sequence[Any]) -> list[Any]:
    """Values of ``c.field`` that `c` rejects: from `universe`, and just past a `Between`'s bounds."""
    if isinstance(c, OneOf):
        return [v for v in universe if v not in c.values]
    if isinstance(c, Between):
        edges = [b + step for b, step in ((c.low, -1), (c.high, 1)) if b is not None]
        inside = [v for v in universe if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return sorted({*edges, *(v for v in inside if (c.low is not None and v < c.low)
                                 or (c.high is not None and v > c.high))})
    if isinstance(c, MultipleOf):
        return [v for v in universe if isinstance(v, int) and not isinstance(v, bool) and v % c.n]
    return []


def check_gates(provider: str, *, device: str = "cpu", ops: Sequence[str] | None = None) -> GateReport:
    """Check that `provider` gates every problem outside its static constraints (see the module docstring).

    Returns:
        The number of problems checked and the failures (a missing provider is one failure).
    """
    report = GateReport()
    resolver = runtime.get_resolver()
    found = resolver.providers.get(provider)
    if found is None or found.error:
        why = found.error if found is not None else "not installed or not allowed"
        report.failures.append(GateFailure("-", provider, "-", "-", f"provider unavailable: {why}"))
        return report
    for impl in found.implementations:
        if impl.op not in OPERATORS or (ops is not None and impl.op not in ops):
            continue
        spec = OPERATORS[impl.op]
        siblings = [i for i in found.implementations if i.op == impl.op]
        for c in impl.capability.constraints:
            if c.environmental or not isinstance(c, (OneOf, Between, MultipleOf)):
                continue
            if c.field not in ("device_type", "dtype", *spec.fields):
                report.failures.append(GateFailure(impl.op, impl.name, c.describe(), "-",
                                                   f"{impl.op} has no problem field {c.field!r}"))
                continue
            for value in outside_values(c, _universe(spec, c.field, resolver.by_op.get(impl.op, ()))):
                problem = spec.problem(**{**_base(impl, device), c.field: value})
                if any(not s.capability.reasons(problem) for s in siblings):
                    continue  # a sibling implementation serves it: not a gap
                report.checked += 1
                failure = _expect_gate(provider, problem, c.field)
                if failure:
                    report.failures.append(GateFailure(impl.op, impl.name, c.describe(), problem.describe(),
                                                       failure))
    return report


def _base(impl: Implementation, device: str) -> dict[str, Any]:
    devices = impl.capability.values("device_type")
    dtypes = impl.capability.values("dtype")
    return {
        "device_type": device if devices is None or device in devices else sorted(devices)[0],
        "dtype": "float32" if dtypes is None or "float32" in dtypes else sorted(dtypes)[0],
    }


def _expect_gate(provider: str, problem: Any, name: str) -> str:
    try:
        with use(provider, op=problem.op):
            chosen = runtime.resolve(problem)
    except GateError as err:
        named = any(r.field == name for c in err.candidates if c.provider == provider for r in c.rejections)
        if not named or name not in str(err):
            return f"GateError does not name the field {name!r}:\n{err}"
        return ""
    except Exception as err:
        return f"resolve raised {type(err).__name__}: {err} instead of GateError"
    return f"resolved to {chosen.name} although no implementation of {provider} accepts it"

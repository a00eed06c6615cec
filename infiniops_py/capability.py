"""Capabilities: what an implementation can serve, as data that explains itself.

A `Capability` is a tuple of named constraints. Each constraint looks at one problem field and, when the
problem breaks it, returns a `Rejection` that names the value found, what is allowed and the fix
(``head_dim=80 not in {64, 128, 256}``). Environment constraints (a needed import, a CUDA device, a
compute capability) are marked so: the committed capability matrix shows them as requirements without
evaluating them, since they depend on the machine. Modelled on xformers' ``not_supported_reasons``.
"""

from __future__ import annotations

import abc
import functools
import importlib.util
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from infiniops_py.errors import Rejection
from infiniops_py.problem import Problem

__all__ = [
    "Between",
    "Capability",
    "Check",
    "ComputeCapability",
    "Constraint",
    "CudaAvailable",
    "MultipleOf",
    "OneOf",
    "Requires",
    "constraint_text",
    "safe_reject",
]


class Constraint(abc.ABC):
    """One condition on one field of a problem."""

    environmental: ClassVar[bool] = False
    field: str = ""

    @abc.abstractmethod
    def reject(self, problem: Problem) -> Rejection | None:
        """The reason `problem` breaks this constraint, or None when it holds."""

    @abc.abstractmethod
    def describe(self) -> str:
        """The constraint as one line of text for the matrix."""


def _set_text(values: Iterable[Any]) -> str:
    items = sorted(values, key=lambda v: (str(type(v)), v))
    return "{" + ", ".join(str(v) for v in items) + "}"


class OneOf(Constraint):
    """``field`` must be one of ``values``."""

    __slots__ = ("field", "fix", "values")

    def __init__(self, field: str, values: Iterable[Any], fix: str = "") -> None:
        self.field = field
        self.values = frozenset(values)
        self.fix = fix

    def reject(self, problem: Problem) -> Rejection | None:
        found = problem.get(self.field)
        if found in self.values:
            return None
        if len(self.values) == 1 and isinstance(next(iter(self.values)), bool):
            allowed = f"is not supported (needs {self.field}={next(iter(self.values))})"
        else:
            allowed = f"not in {_set_text(self.values)}"
        return Rejection("one_of", self.field, found, allowed, self.fix or self._default_fix())

    def _default_fix(self) -> str:
        if len(self.values) == 1:
            return f"use {self.field}={next(iter(self.values))}"
        return f"use {self.field} in {_set_text(self.values)}"

    def describe(self) -> str:
        if len(self.values) == 1 and isinstance(next(iter(self.values)), bool):
            return f"{self.field}={next(iter(self.values))}"
        return f"{self.field} in {_set_text(self.values)}"


class Between(Constraint):
    """``low <= field <= high`` (either bound may be None)."""

    __slots__ = ("field", "fix", "high", "low")

    def __init__(self, field: str, low: int | float | None, high: int | float | None, fix: str = "") -> None:
        self.field, self.low, self.high, self.fix = field, low, high, fix

    def reject(self, problem: Problem) -> Rejection | None:
        found = problem.get(self.field)
        if (self.low is None or found >= self.low) and (self.high is None or found <= self.high):
            return None
        return Rejection("between", self.field, found, f"not in [{self.low}, {self.high}]",
                         self.fix or f"use {self.describe()}")

    def describe(self) -> str:
        if self.low is None:
            return f"{self.field} <= {self.high}"
        if self.high is None:
            return f"{self.field} >= {self.low}"
        return f"{self.low} <= {self.field} <= {self.high}"


class MultipleOf(Constraint):
    """``field % n == 0``."""

    __slots__ = ("field", "fix", "n")

    def __init__(self, field: str, n: int, fix: str = "") -> None:
        self.field, self.n, self.fix = field, n, fix

    def reject(self, problem: Problem) -> Rejection | None:
        found = problem.get(self.field)
        if found % self.n == 0:
            return None
        return Rejection("multiple_of", self.field, found, f"is not a multiple of {self.n}",
                         self.fix or f"pad {self.field} to a multiple of {self.n}")

    def describe(self) -> str:
        return f"{self.field} % {self.n} == 0"


class Check(Constraint):
    """A custom predicate over the whole problem, with its own wording."""

    __slots__ = ("allowed", "field", "fix", "predicate", "text")

    def __init__(self, field: str, predicate: Callable[[Problem], bool], text: str, fix: str = "") -> None:
        self.field, self.predicate, self.text, self.fix = field, predicate, text, fix

    def reject(self, problem: Problem) -> Rejection | None:
        if self.predicate(problem):
            return None
        return Rejection("check", self.field, problem.get(self.field), f"breaks: {self.text}", self.fix)

    def describe(self) -> str:
        return self.text


@functools.cache
def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


@functools.cache
def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@functools.cache
def _compute_capability() -> tuple[int, int] | None:
    import torch

    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None


class Requires(Constraint):
    """A Python module must be importable."""

    environmental = True
    __slots__ = ("field", "module", "package")

    def __init__(self, module: str, package: str = "") -> None:
        self.field, self.module, self.package = "import", module, package or module

    def reject(self, problem: Problem) -> Rejection | None:
        if _importable(self.module):
            return None
        return Rejection("requires", "import", self.module, "is not importable",
                         f"pip install {self.package}")

    def describe(self) -> str:
        return f"needs {self.module}"


class CudaAvailable(Constraint):
    """A ``cuda`` problem needs a CUDA device to be present (checked once per process).

    Problems on other devices pass. `Capability` adds this constraint by itself when its devices include
    ``cuda``: no provider can serve a cuda problem on a machine without a CUDA device, and the resolver
    and `explain` then say so instead of picking an implementation that cannot run.
    """

    environmental = True
    __slots__ = ("always", "cpu", "field")

    def __init__(self, *, always: bool = False, cpu: bool = True) -> None:
        """`always`: reject every problem, whatever its device, when the machine has no CUDA device (for
        providers that cannot work at all without one, such as CuPy). `cpu`: whether the implementation
        also serves cpu problems, so that the fix may suggest ``device_type=cpu`` (`Capability` sets it)."""
        self.field = "device"
        self.always = always
        self.cpu = cpu and not always

    def reject(self, problem: Problem) -> Rejection | None:
        if (problem.device_type != "cuda" and not self.always) or _cuda_available():
            return None
        fix = "run on a machine with a CUDA GPU" + (", or use device_type=cpu" if self.cpu else "")
        if problem.device_type != "cuda":
            return Rejection("cuda", "device", "cuda", "is needed by this provider and not present on this "
                             "machine (no CUDA device)", fix)
        return Rejection("cuda", "device", "cuda", "is not present on this machine (no CUDA device)", fix)

    def describe(self) -> str:
        return "cuda needs a CUDA device"


class ComputeCapability(Constraint):
    """The CUDA device's compute capability must be at least ``minimum`` (only checked on cuda)."""

    environmental = True
    __slots__ = ("field", "minimum")

    def __init__(self, minimum: tuple[int, int]) -> None:
        self.field, self.minimum = "compute_capability", minimum

    def reject(self, problem: Problem) -> Rejection | None:
        if problem.device_type != "cuda":
            return None
        found = _compute_capability()
        if found is None or found >= self.minimum:
            return None
        need = f"{self.minimum[0]}.{self.minimum[1]}"
        return Rejection("compute_capability", "compute_capability", f"{found[0]}.{found[1]}",
                         f"is below {need}", f"use a GPU of compute capability {need} or newer")

    def describe(self) -> str:
        return f"compute capability >= {self.minimum[0]}.{self.minimum[1]}"


def constraint_text(c: Constraint) -> str:
    """``c.describe()``, or the constraint's class name when a faulty plugin constraint's describe raises."""
    try:
        text = c.describe()
    except BaseException:  # describe() of a faulty plugin constraint may raise anything (SystemExit too)
        return type(c).__name__
    return text if type(text) is str else type(c).__name__


def _exception_text(exc: BaseException) -> str:
    """``Name: message``, or the name alone when the exception's own ``__str__`` raises."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except BaseException:
        return type(exc).__name__


def safe_reject(c: Constraint, problem: Problem) -> Rejection | None:
    """``c.reject(problem)``, except that a check which raises anything (``SystemExit``, ``KeyboardInterrupt``
    and exceptions whose message itself raises included), or which returns something other than None or a
    `Rejection` whose texts are str, is a rejection of its own.

    The rejection reads ``<field>=<value> (constraint <name> raised ZeroDivisionError: division by zero)``
    (or ``... returned str, not a Rejection or None``) and carries no fix (nothing about the problem can fix
    a faulty constraint), so the resolver never picks that candidate and the others still serve. A plugin's
    constraint is foreign code: nothing it does may end or crash the caller, so a Ctrl-C that lands exactly
    inside one is taken as its failure too.
    """
    try:
        found = c.reject(problem)
        if found is None:
            return None
        if type(found) is Rejection and all(type(v) is str for v in (found.field, found.allowed, found.fix)):
            return found
        kind, why = "invalid", f"returned {type(found).__name__}, not a Rejection or None"
        if type(found) is Rejection:
            why = "returned a Rejection whose field, allowed or fix is not a str"
    except BaseException as exc:  # foreign code: contain everything
        kind, why = "raised", f"raised {_exception_text(exc)}"
    field = c.field if type(c.field) is str else "?"
    return Rejection(kind, field, problem.get(field), f"(constraint {constraint_text(c)} {why})")


class Capability:
    """What one implementation serves: a tuple of constraints, all of which must hold."""

    __slots__ = ("constraints",)

    def __init__(self, *constraints: Constraint) -> None:
        """Raises:
            TypeError: an argument that is not a `Constraint` (say, a bare tuple of values).
        """
        for n, c in enumerate(constraints):
            if not isinstance(c, Constraint):
                raise TypeError(f"Capability: argument {n} is {type(c).__name__} {c!r}, not a Constraint "
                                "(use OneOf, Between, MultipleOf, Check, Requires, ...)")
        self.constraints = tuple(constraints)
        devices = self.values("device_type")
        if (devices is None or "cuda" in devices) and not any(isinstance(c, CudaAvailable) for c in constraints):
            self.constraints += (CudaAvailable(cpu=devices is None or "cpu" in devices),)

    def reasons(self, problem: Problem, *, environment: bool = True) -> tuple[Rejection, ...]:
        """Every rejection of `problem`; empty when the capability accepts it.

        A constraint whose check raises rejects the problem (see `safe_reject`) instead of propagating,
        so one faulty plugin constraint cannot break the other providers of the operator.
        """
        out = []
        for c in self.constraints:
            if c.environmental and not environment:
                continue
            r = safe_reject(c, problem)
            if r is not None:
                out.append(r)
        return tuple(out)

    def values(self, field: str) -> frozenset[Any] | None:
        """The allowed values of `field` when a `OneOf` constrains it, else None (unconstrained)."""
        found: frozenset[Any] | None = None
        for c in self.constraints:
            if isinstance(c, OneOf) and c.field == field:
                found = c.values if found is None else found & c.values
        return found

    def describe(self, skip: Iterable[str] = ("device_type", "dtype")) -> list[str]:
        """Each constraint as text, except those on the `skip` fields."""
        skipped = set(skip)
        return [constraint_text(c) for c in self.constraints if c.field not in skipped]

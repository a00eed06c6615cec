"""Exceptions raised by InfiniOps-Py.

`ContractError` is raised by a public operator before any kernel runs when an argument breaks the
operator's contract. `GateError` is raised by the resolver when no provider can serve a problem; it
carries every candidate and the constraints that rejected it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from infiniops_py.operators._base import ContractError

if TYPE_CHECKING:
    from infiniops_py.operators._base import Problem

__all__ = ["CandidateReport", "ContractError", "GateError", "Rejection"]


@dataclass(frozen=True)
class Rejection:
    """Why one constraint rejects a problem: the field, the value found, what is allowed, the fix."""

    constraint: str
    field: str
    found: Any
    allowed: str
    fix: str = ""

    def __str__(self) -> str:
        text = f"{self.field}={_fmt(self.found)} {self.allowed}"
        return f"{text} (fix: {self.fix})" if self.fix else text


@dataclass(frozen=True)
class CandidateReport:
    """One candidate implementation as the resolver saw it: accepted when `rejections` is empty."""

    provider: str
    implementation: str
    priority: int
    rejections: tuple[Rejection, ...] = field(default_factory=tuple)
    note: str = ""

    @property
    def accepted(self) -> bool:
        return not self.rejections and not self.note


class GateError(RuntimeError):
    """No provider can serve a problem (or a whole closure of problems).

    Attributes:
        gaps: for each problem that could not be served, the problem and every candidate's report,
            candidates ordered so that the one needing the fewest changes (the most likely fix) comes first.
    """

    def __init__(self, gaps: Sequence[tuple[Problem, Sequence[CandidateReport]]], headline: str = "") -> None:
        self.gaps = [(p, _by_likely_fix(c)) for p, c in gaps]
        self.headline = headline
        super().__init__(self.render())

    @property
    def problem(self) -> Problem:
        return self.gaps[0][0]

    @property
    def candidates(self) -> list[CandidateReport]:
        return self.gaps[0][1]

    def render(self) -> str:
        lines: list[str] = []
        if self.headline:
            lines.append(self.headline)
        for problem, candidates in self.gaps:
            lines.append(f"no provider can serve {problem.op} for {problem.describe()}")
            if not candidates:
                lines.append("  no provider implements this operator (is a provider plugin installed?)")
            for cand in candidates:
                lines.append(f"  {cand.provider} ({cand.implementation}, priority {cand.priority}):")
                if cand.note:
                    lines.append(f"    - {cand.note}")
                lines.extend(f"    - {r}" for r in cand.rejections)
            fix = next((c for c in candidates if c.rejections), None)
            if fix is not None and all(r.fix for r in fix.rejections):
                todo = "; ".join(r.fix for r in fix.rejections)
                lines.append(f"  most likely fix: {todo} (to use {fix.provider})")
        return "\n".join(lines)


def _by_likely_fix(candidates: Sequence[CandidateReport]) -> list[CandidateReport]:
    return sorted(candidates, key=lambda c: (bool(c.note), len(c.rejections), -c.priority))


def _fmt(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)

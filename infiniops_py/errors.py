"""Exceptions raised by InfiniOps-Py.

`ContractError` is raised by a public operator before any kernel runs when an argument breaks the
operator's contract. `GateError` is raised by the resolver when no provider can serve a problem; it
carries every candidate and the constraints that rejected it. A report of several problems says each
reason that rejects candidates in more than one of them once (a machine without a CUDA device: one
line naming the problems it blocks), then what else each problem is missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infiniops_py.problem import Problem

__all__ = ["CandidateReport", "ContractError", "GateError", "Rejection", "likely_fix"]


class ContractError(ValueError):
    """An argument breaks an operator's contract.

    The message names the argument, the value found and what the contract needs, e.g.
    ``flash_attn_varlen: k: expected dtype torch.bfloat16 (same as q), got torch.float16``.
    """

    def __init__(self, op: str, argument: str, message: str) -> None:
        self.op = op
        self.argument = argument
        super().__init__(f"{op}: {argument}: {message}")


@dataclass(frozen=True)
class Rejection:
    """Why one constraint rejects a problem: the field, the value found, what is allowed, the fix."""

    constraint: str
    field: str
    found: Any
    allowed: str
    fix: str = ""

    def __str__(self) -> str:
        return f"{self.reason()} (fix: {self.fix})" if self.fix else self.reason()

    def reason(self) -> str:
        """What was found and what is allowed, without the fix: ``head_dim=80 not in {64, 128}``."""
        return f"{self.field}={_fmt(self.found)} {self.allowed}"


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
        """The report: the headline, then each problem with every candidate and why it was rejected, and the
        most likely fix. With several problems, a reason that rejects candidates in more than one of them is
        said once, numbered, naming the problems and providers it blocks; each problem then refers to it by
        number and lists only what else is missing, and a most likely fix common to every problem is said
        once at the end."""
        lines: list[str] = [self.headline] if self.headline else []
        shared = _shared_reasons(self.gaps) if len(self.gaps) > 1 else {}
        if shared:
            lines.append("reasons shared by several problems:")
            lines.extend(f"  [{n}] {text}" for n, text in enumerate(_shared_lines(self.gaps, shared), 1))
        fixes = [likely_fix(c) for _, c in self.gaps]
        common = fixes[0] if shared and len(set(fixes)) == 1 else None
        for (problem, candidates), fix in zip(self.gaps, fixes):
            lines.append(f"no provider can serve {problem.op} for {problem.describe()}")
            if not candidates:
                lines.append("  no provider implements this operator (is a provider plugin installed?)")
            lines.extend(_candidate_lines(candidates, shared))
            if fix is not None and common is None:
                lines.append(f"  most likely fix: {fix[0]} (to use {fix[1]})")
        if common is not None:
            lines.append(f"most likely fix, for every problem above: {common[0]} (to use {common[1]})")
        return "\n".join(lines)


def likely_fix(candidates: Sequence[CandidateReport]) -> tuple[str, str] | None:
    """The most likely fix among `candidates`: the fixes of the loaded candidate with the fewest rejections
    (then the highest priority) whose every rejection says its fix, as ``(fixes joined by '; ', provider)``;
    None when no candidate's rejections all carry a fix."""
    fixable = [c for c in candidates if c.rejections and not c.note and all(r.fix for r in c.rejections)]
    if not fixable:
        return None
    best = min(fixable, key=lambda c: (len(c.rejections), -c.priority))
    return "; ".join(r.fix for r in best.rejections), best.provider


def _shared_reasons(gaps: Sequence[tuple[Problem, Sequence[CandidateReport]]]) -> dict[str, int]:
    """Reason text -> its number, for the reasons found in more than one problem, in order of first sight."""
    seen: dict[str, set[int]] = {}
    for n, (_, candidates) in enumerate(gaps):
        for cand in candidates:
            for r in cand.rejections:
                seen.setdefault(r.reason(), set()).add(n)
    numbered = [text for text, where in seen.items() if len(where) > 1]
    return {text: n for n, text in enumerate(numbered, 1)}


def _shared_lines(gaps: Sequence[tuple[Problem, Sequence[CandidateReport]]], shared: dict[str, int]) -> list[str]:
    """One line per shared reason: the problems (operators) and providers it rejects, and its fix."""
    ops: dict[str, dict[str, None]] = {t: {} for t in shared}
    providers: dict[str, dict[str, None]] = {t: {} for t in shared}
    fixes: dict[str, dict[str, None]] = {t: {} for t in shared}
    counts = dict.fromkeys(shared, 0)
    for problem, candidates in gaps:
        hit: set[str] = set()
        for cand in candidates:
            for r in cand.rejections:
                text = r.reason()
                if text in shared:
                    ops[text][problem.op] = None
                    providers[text][cand.provider] = None
                    if r.fix:
                        fixes[text][r.fix] = None
                    hit.add(text)
        for text in hit:
            counts[text] += 1
    out = []
    for text in shared:
        # a fix contained in a longer one ("use a GPU" in "use a GPU, or use device_type=cpu") is said by it
        kept = [f for f in fixes[text] if not any(f != g and f in g for g in fixes[text])]
        fix = f" (fix: {'; or '.join(kept)})" if kept else ""
        out.append(f"{text}: rejects {', '.join(providers[text])} in {counts[text]} problems "
                   f"({', '.join(ops[text])}){fix}")
    return out


def _candidate_lines(candidates: Sequence[CandidateReport], shared: dict[str, int]) -> list[str]:
    """Each candidate and its reasons; with `shared` reasons, those are numbers, and the candidates
    rejected by shared reasons alone go on one line, grouped by the numbers."""
    lines: list[str] = []
    only_shared: dict[str, list[str]] = {}
    for cand in candidates:
        own = [r for r in cand.rejections if r.reason() not in shared]
        refs = ", ".join(dict.fromkeys(f"[{shared[r.reason()]}]" for r in cand.rejections if r.reason() in shared))
        if refs and not own and not cand.note:
            only_shared.setdefault(refs, []).append(cand.provider)
            continue
        lines.append(f"  {cand.provider} ({cand.implementation}, priority {cand.priority}):")
        if cand.note:
            lines.append(f"    - {cand.note}")
        lines.extend(f"    - {r}" for r in own)
        if refs:
            lines.append(f"    - and {refs} above")
    if only_shared:
        grouped = "; ".join(f"{', '.join(names)}: {refs}" for refs, names in only_shared.items())
        lines.insert(0, f"  {grouped}")
    return lines


def _by_likely_fix(candidates: Sequence[CandidateReport]) -> list[CandidateReport]:
    return sorted(candidates, key=lambda c: (bool(c.note), len(c.rejections), -c.priority))


def _fmt(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)

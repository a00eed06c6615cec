"""What a resolution says about itself: the full ranking (`Explanation`) and a fallback (`Fallback`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from infiniops_py.errors import CandidateReport, likely_fix
from infiniops_py.problem import Problem
from infiniops_py.registry import Implementation
from infiniops_py.tuning.ranking import format_time
from infiniops_py.tuning.store import Measurement

__all__ = ["Explanation", "Fallback"]


@dataclass(frozen=True)
class Fallback:
    """A resolution that did not get the preferred implementation.

    Attributes:
        problem: the problem resolved.
        chosen: the name of the implementation that serves it.
        passed_over: the reports of the candidates preferred to it that rejected the problem, and of the
            preferred (or allowed) providers that are not loaded: implementation ``-``, the reason in the note.
    """

    problem: Problem
    chosen: str
    passed_over: tuple[CandidateReport, ...]

    def __str__(self) -> str:
        why = "; ".join(f"{c.provider}: " + ", ".join([*map(str, c.rejections), *filter(None, (c.note,))])
                        for c in self.passed_over)
        return f"{self.problem.op} {self.problem.describe()} fell back to {self.chosen} ({why})"


@dataclass(frozen=True)
class Explanation:
    """The full ranking for one problem, as `explain` returns it (nothing runs).

    Attributes:
        note: what the overrides excluded, and forced providers that are not loaded.
        problems: the configuration problems that concern the operator (names of the environment or of the
            ``use(...)`` scopes that match no loaded provider, or no operator); strict mode refuses to
            resolve while there is one.
        measurement: this device's times for the problem's size bucket, or None (no bucket, none measured).
        why: why the chosen implementation won (the fastest measured, a tie its priority broke, an override,
            or priority where nothing was measured, saying why); empty when nothing is chosen.
    """

    problem: Problem
    candidates: tuple[CandidateReport, ...]
    chosen: Implementation | None
    fallback: Fallback | None
    note: str = ""
    problems: tuple[str, ...] = ()
    measurement: Measurement | None = None
    why: str = ""

    def times_line(self) -> str:
        """``chosen: torch.addmm 31 us; cupy.gemm_cublas 33 us; triton.gemm 72 us (NVIDIA H200, measured
        2026-12-01)``: the chosen implementation and every other timed one with their times, in ranking order;
        empty without a measurement or a chosen implementation."""
        m = self.measurement
        if m is None or self.chosen is None or not m.times:
            return ""
        names = [self.chosen.name, *(c.implementation for c in self.candidates
                                     if c.implementation in m.times and c.implementation != self.chosen.name)]
        parts = [f"{n} {format_time(m.times[n])}" if n in m.times else f"{n} (not measured)" for n in names]
        where = ", ".join(filter(None, (m.device, f"measured {m.measured}" if m.measured else "")))
        return "chosen: " + "; ".join(parts) + (f" ({where})" if where else "")

    def render(self, cannot_run: Callable[[CandidateReport], str] | None = None) -> str:
        """The ranking as ``infiniops explain`` prints it: the problem, the notes, each candidate (chosen,
        accepts or rejects, with its reasons and its measured time for the bucket), the chosen one's times line
        (`times_line`) and why it won, then the fallback, or, when nothing serves the problem, the most likely
        fix (`errors.likely_fix`).

        `cannot_run`: for a candidate, why it cannot run on this machine at all, or ''; a candidate it names is
        one line, ``N. cupy (cupy.rms_norm, priority 15): cannot run on this machine: <why>``, instead of its
        every rejection (the CLI's: a provider that needs a GPU on a machine without one)."""
        lines = [f"{self.problem.op} {self.problem.describe()}"]
        if self.note:
            lines.append(f"  note: {self.note}")
        lines.extend(f"  configuration: {m}" for m in self.problems)
        for rank, c in enumerate(self.candidates, 1):
            ours = self.chosen is not None and (c.provider, c.implementation) == (self.chosen.provider,
                                                                               self.chosen.name)
            mark = "chosen" if ours else ("accepts" if c.accepted else "rejects")
            timed = ""
            if self.measurement is not None and c.implementation in self.measurement.times:
                timed = f", measured {format_time(self.measurement.times[c.implementation])}"
            elif self.measurement is not None and c.implementation in self.measurement.failed:
                timed = f", failed when timed: {self.measurement.failed[c.implementation]}"
            machine = cannot_run(c) if cannot_run is not None and not c.accepted else ""
            if machine:
                lines.append(f"  {rank}. {c.provider} ({c.implementation}, priority {c.priority}{timed}): cannot "
                             f"run on this machine: {machine}")
                continue
            lines.append(f"  {rank}. {c.provider} ({c.implementation}, priority {c.priority}{timed}): {mark}")
            if c.note:
                lines.append(f"       - {c.note}")
            lines.extend(f"       - {r}" for r in c.rejections)
        if self.chosen is None:
            lines.append("  no provider can serve this problem")
            fix = likely_fix(self.candidates)
            if fix is not None:
                lines.append(f"  most likely fix: {fix[0]} (to use {fix[1]})")
        else:
            if self.times_line():
                lines.append(f"  {self.times_line()}")
            if self.why:
                lines.append(f"  why: {self.why}")
            if self.fallback is not None:
                lines.append(f"  fallback: {self.fallback}")
        return "\n".join(lines)

"""The conformance suite's report types: one row per (operator, dtype, implementation), and the whole run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Final

from infiniops_py.testing.gates import GateReport

__all__ = ["NOTHING_RAN", "Failure", "OpReport", "Report"]

NOTHING_RAN: Final = "no case ran: the provider's capability gated every case drawn, so nothing was compared"
_KEPT_FAILURES: Final = 5


@dataclass
class Failure:
    """One failing case: what it was (the strategy's note) and what went wrong."""

    note: str
    message: str

    def __str__(self) -> str:
        return f"[{self.note}] {self.message}" if self.note else self.message


def _order(value: Any) -> tuple[str, Any]:
    return (type(value).__name__, value if isinstance(value, (int, float)) else repr(value))


@dataclass
class OpReport:
    """The outcome for one (operator, dtype, implementation)."""

    op: str
    dtype: str
    implementation: str
    examples: int = 0
    gated: int = 0
    failed: int = 0
    worst: float = 0.0
    worst_allowed: float = 0.0  # the worst error as a share of the error the tolerance allows (1: the limit)
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0
    coverage: dict[str, list[Any]] = field(default_factory=dict)  # values run (not gated), per field or size

    @property
    def ok(self) -> bool:
        return self.failed == 0

    def cover(self, seen: dict[str, Any]) -> None:
        """Add one run case's drawn values (`CaseContext.seen`) to `coverage`."""
        for name, value in seen.items():
            values = self.coverage.setdefault(name, [])
            if value not in values:
                values.append(value)

    def render_coverage(self) -> str:
        """``name: v1 v2 ...`` per recorded field (flags left out), values sorted, sizes as their maximum."""
        parts = []
        for name, values in sorted(self.coverage.items()):
            if all(isinstance(v, bool) for v in values):
                continue
            if name.startswith("max_"):
                parts.append(f"{name}={max(values)}")
            else:
                parts.append(f"{name}: {' '.join(str(v) for v in sorted(values, key=_order))}")
        return "; ".join(parts)

    def fail(self, note: str, message: str) -> None:
        self.failed += 1
        if len(self.failures) < _KEPT_FAILURES:
            self.failures.append(Failure(note, message))


@dataclass
class Report:
    """The conformance of one provider on one device."""

    provider: str
    device: str
    ops: list[OpReport] = field(default_factory=list)
    gates: GateReport | None = None
    error: str = ""

    @property
    def ran(self) -> int:
        """How many cases ran and were compared (drawn, less those gated), over every row."""
        return sum(r.examples - r.gated for r in self.ops)

    @property
    def ok(self) -> bool:
        """No error, no failure, no gate failure, and at least one case compared: a check of nothing fails."""
        gates_ok = self.gates is None or not self.gates.failures
        return not self.error and gates_ok and self.ran > 0 and all(r.ok for r in self.ops)

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data (for ``infiniops check --json``), with ``ok`` filled in."""
        return {**dataclasses.asdict(self), "ok": self.ok}

    def render(self) -> str:
        """The report as plain text: one line per (operator, dtype, implementation), then every failure."""
        lines = [f"conformance of provider {self.provider!r} on {self.device}: {'ok' if self.ok else 'FAILED'}"]
        if self.error:
            return "\n".join([*lines, f"  {self.error}"])
        for r in self.ops:
            lines.append(f"  {r.op:<26} {r.dtype:<9} {r.implementation:<34} run {r.examples:>4}  gated {r.gated:>4}"
                         f"  failed {r.failed:>4}  worst |err| {r.worst:.3g} ({r.worst_allowed:.2f} of allowed)")
        if not self.ran:
            lines.append(f"  {NOTHING_RAN}")
        if self.gates is not None:
            lines.append(f"  gate checks: {self.gates.checked} problems outside the capability, "
                         f"{len(self.gates.failures)} not rejected with GateError")
        for r in self.ops:
            lines.extend(f"FAIL {r.op} {r.dtype} ({r.implementation}): {f}" for f in r.failures)
        if self.gates is not None:
            lines.extend(f"FAIL gate {f}" for f in self.gates.failures)
        return "\n".join(lines)

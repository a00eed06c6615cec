"""The conformance suite: property-test a provider against the float64 references.

For each implementation of the provider, each operator with a strategy and each dtype it declares among
float16, bfloat16 and float32 on the device, hypothesis draws cases (`STRATEGIES`). Each case runs:

1. the operator's public function under ``use("reference")`` on float64 copies of the inputs on the
   *reference device* (index tensors keep their dtype; views keep their aliasing), giving the expected
   outputs; for `LowPrecisionRule` entries also on copies in the input's own dtype, on the same device;
2. the same function under ``use(provider)`` (forced: it never falls back), with uninitialized memory
   NaN-filled (torch's deterministic fill mode), now and then a NaN-filled ``out=``, and every argument's
   storage moved into a buffer with poison bands on both sides (`effects.guarded`);
3. the checks of what the call returned and touched (`effects`): the result is the contract's objects
   (the ``out=`` tensor, the argument updated in place, or a new tensor, as in the reference run); each
   implementation call returned what the reference implementation's did (its ``out`` argument itself, or
   None); and no byte of the arguments' memory changed outside the outputs (`Case.mutated` and ``out=``):
   an input the contract leaves untouched is bit for bit as before, and so are the bytes around and
   between the arguments' elements;
4. the comparison of the result and the mutated arguments with the tolerance table, `Case.exact` outputs
   bit for bit, `Case.untouched` parts unchanged.

The reference device is the CPU, except on cuda, where it defaults to the device under test: at the sizes
the suite draws there (`CaseContext.large`: 8192-token attention, 4096-step scans) float64 on the CPU
would take minutes per case. The oracle stays the same literal reference in float64, and the comparison
runs on the reference device in float64 too; only where it runs changes (its float64 results agree with
the CPU's to rounding). The low-dtype run of `LowPrecisionRule` then runs on the GPU as well, as
flash-attention's own test runs its low-precision reference (cuBLAS's default reduced-precision
reductions included).

A `GateError` counts as *gated* when the provider's capability really rejects the problem; any other
exception fails. `check_gates` also checks that problems outside each static constraint are rejected by
the resolver with a `GateError` naming the field, never another exception.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import hypothesis
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import HypothesisException

from infiniops_py.operators import OPERATORS
from infiniops_py.problem import OpSpec
from infiniops_py.registry import Implementation
from infiniops_py.testing.case import CaseContext
from infiniops_py.testing.case_check import allowed_share, check_case, copies, cpu_copies, first_line, poisoned
from infiniops_py.testing.gates import GateFailure, GateReport, check_gates
from infiniops_py.testing.lookup import (
    DTYPES,
    NO_CUDA,
    declared_dtypes,
    declared_pairs,
    loaded_provider,
    serves_nothing,
)
from infiniops_py.testing.report import NOTHING_RAN, Failure, OpReport, Report
from infiniops_py.testing.strategies import strategy as strategy_of
from infiniops_py.testing.tolerances import tolerance

__all__ = [
    "DTYPES",
    "NOTHING_RAN",
    "Failure",
    "GateFailure",
    "GateReport",
    "OpReport",
    "Report",
    "allowed_share",
    "check_gates",
    "copies",
    "cpu_copies",
    "declared_pairs",
    "poisoned",
    "run_conformance",
    "serves_nothing",
]


def run_conformance(
    provider: str,
    *,
    device: str = "cpu",
    ops: Sequence[str] | None = None,
    dtypes: Sequence[str] | None = None,
    max_examples: int = 100,
    gates: bool = True,
    seed: int | None = None,
    reference_device: str | None = None,
    large: bool | None = None,
    progress: Callable[[OpReport, float, str, str], None] | None = None,
) -> Report:
    """Property-test `provider` on `device` against the references.

    Args:
        ops, dtypes: restrict the run (None: every operator and dtype the provider declares).
        max_examples: hypothesis examples per (implementation, dtype).
        gates: also run `check_gates` on the same operators.
        seed: fix hypothesis's random draws, to replay a failing run (None: fresh draws each run).
        reference_device: where the float64 reference runs (None: `device` when it is cuda, else cpu);
            see the module docstring.
        large: draw GPU-scale cases (`CaseContext.large`; None: when `device` is cuda).
        progress: called after every example with the row's report so far, the example's seconds, its
            case note and its outcome (``"ok"``, ``"gated"`` or the failure); the CLI's ``--progress``.

    Returns:
        The report; ``report.ok`` is False on any failure, and when no case ran at all (``report.error``
        says why when the provider serves nothing there, or when `device` is cuda and the machine has no
        CUDA device). Nothing raises for a failing provider.
    """
    report = Report(provider, device)
    ref_device = torch.device(reference_device or ("cuda" if device == "cuda" else "cpu"))
    scale = _Scale(device == "cuda" if large is None else large, ref_device)
    found, report.error = loaded_provider(provider)
    if found is None:
        return report
    if device == "cuda" and not torch.cuda.is_available():
        report.error = NO_CUDA
        return report
    for impl in sorted(found.implementations, key=lambda i: (list(OPERATORS).index(i.op) if i.op in OPERATORS
                                                              else len(OPERATORS), i.name)):
        if impl.op not in OPERATORS or (ops is not None and impl.op not in ops):
            continue
        for dtype in declared_dtypes(impl, device):
            if dtypes is None or dtype in dtypes:
                op_report = OpReport(impl.op, dtype, impl.name)
                report.ops.append(op_report)
                strategy = strategy_of(impl.op)
                if strategy is None:
                    op_report.fail("", f"no conformance strategy for {impl.op} (infiniops_py/testing/strategies)")
                    continue
                _run(op_report, provider, OPERATORS[impl.op], impl, strategy, device, max_examples, seed, scale,
                     progress)
    if not report.ops:
        report.error = serves_nothing(found, device, ops, dtypes)
        return report
    if gates:
        report.gates = check_gates(provider, device=device, ops=ops)
    return report


@dataclass(frozen=True)
class _Scale:
    """How big the drawn cases are (`CaseContext.large`) and where their reference runs."""

    large: bool
    reference_device: torch.device


def _run(report: OpReport, provider: str, spec: OpSpec, impl: Implementation, strategy: Any, device: str,
         max_examples: int, seed: int | None, scale: _Scale,
         progress: Callable[[OpReport, float, str, str], None] | None = None) -> None:
    try:
        tol = tolerance(spec.name, report.dtype)
    except KeyError as err:
        report.fail("", str(err.args[0]))
        return
    dev, dtype = torch.device(device), getattr(torch, report.dtype)

    @settings(max_examples=max_examples, deadline=None, derandomize=False, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def body(data: st.DataObject) -> None:
        case = None
        began = time.perf_counter()
        ctx = CaseContext(dev, dtype, spec, impl, data.draw, large=scale.large)
        try:
            case = strategy(ctx)
            outcome = check_case(provider, spec, case, tol, dev, dtype, data.draw, scale.reference_device)
        except HypothesisException:
            raise
        except Exception as err:  # a crashing strategy or reference is a failure, not a stop
            who = "the strategy" if case is None else "the reference"
            outcome = f"{who} raised {type(err).__name__}: {first_line(err)}"
        report.examples += 1
        if outcome != "gated":
            report.cover(ctx.seen)
        if isinstance(outcome, tuple):
            report.worst = max(report.worst, outcome[0])
            report.worst_allowed = max(report.worst_allowed, outcome[1])
        elif outcome == "gated":
            report.gated += 1
        else:
            report.fail(case.note if case is not None else "", outcome)
        if progress is not None:
            said = "ok" if isinstance(outcome, tuple) else outcome
            progress(report, time.perf_counter() - began, case.note if case is not None else "", said)

    start = time.perf_counter()
    (body if seed is None else hypothesis.seed(seed)(body))()
    report.seconds = time.perf_counter() - start

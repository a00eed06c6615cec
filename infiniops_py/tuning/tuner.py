"""The tuner: time every implementation that accepts a problem bucket, and hand the times to the resolver.

`tune_calls` takes recorded implementation calls (`infiniops_py.tuning.capture`): for each problem with a size
bucket that this device has no measurement of yet, or one that lacks a candidate of today (denied when it was
timed, or installed since), or every one with `force`, it times each accepting
implementation (except the last-resort ``reference``) on the call's own arguments with the `Timer`
(`infiniops_py.tuning.timer.measure`: warm-up, median of repeats), adds the `Measurement` to the resolver's
`TuningTable` (which persists it, see `infiniops_py.tuning.store`) and clears the resolver's decision cache, so
that the next call of that bucket resolves by measured time. A problem with fewer than two candidates is not
timed (there is nothing to choose). An implementation that raises when timed (``SystemExit`` included), or whose
timer returns no time in seconds >= 0 (NaN, inf), is recorded as failed and never chosen by time. The whole
run is bounded by `budget_s`, overrun by at most one call of an implementation: no call starts once it is
spent, and the problem whose timing that interrupts is skipped, keeping nothing; problems left keep their
priority ranking. Nothing is timed while a CUDA stream captures a graph.

`tune_problem` builds synthetic inputs of a bucket's representative size (`infiniops_py.tuning.inputs`) and
tunes the calls they make.
"""

from __future__ import annotations

import datetime
import functools
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import torch

from infiniops_py import runtime
from infiniops_py.problem import Problem
from infiniops_py.registry import Implementation
from infiniops_py.tuning import inputs
from infiniops_py.tuning.capture import CapturedCall, recording
from infiniops_py.tuning.ranking import format_time
from infiniops_py.tuning.store import Measurement, is_time
from infiniops_py.tuning.timer import CaptureError, Timer, capturing, measure

__all__ = ["DEFAULT_BUDGET_S", "Progress", "TuneReport", "TuneResult", "candidates", "tune_calls", "tune_problem"]

DEFAULT_BUDGET_S: Final = 120.0
Progress = Callable[[int, int, str], None]  # (done, total, what is being timed)
_REFERENCE: Final = "reference"


@dataclass(frozen=True)
class TuneResult:
    """What the tuner did with one problem bucket.

    Attributes:
        status: ``measured`` (timed now), ``reused`` (this device had its times already) or ``skipped``.
        measurement: the times (measured or reused), or None when skipped.
        note: why it was skipped (no bucket, one candidate, the time budget, CUDA-graph capture).
    """

    problem: Problem
    status: str
    measurement: Measurement | None = None
    note: str = ""


@dataclass
class TuneReport:
    """Every problem bucket the tuner saw, and how long it took (seconds, wall time)."""

    results: list[TuneResult] = field(default_factory=list)
    seconds: float = 0.0

    def count(self, status: str) -> int:
        """How many results have `status`."""
        return sum(r.status == status for r in self.results)

    def summary(self) -> str:
        """``tuned 12 problem buckets in 3.4 s: 8 measured, 4 reused, 0 skipped``."""
        return (f"tuned {len(self.results)} problem bucket(s) in {self.seconds:.2f} s: {self.count('measured')} "
                f"measured, {self.count('reused')} reused, {self.count('skipped')} skipped")

    def table(self) -> str:
        """One line per bucket: the operator, the bucket, each timed implementation fastest first (the chosen one
        marked ``*``), or why it was skipped."""
        lines = []
        for r in self.results:
            head = f"{r.problem.op} {r.problem.dtype} {r.problem.describe_bucket() or '(no bucket)'}"
            m = r.measurement
            if m is None:
                lines.append(f"{head}: {r.status} ({r.note})")
                continue
            order = sorted(m.times, key=m.times.__getitem__)
            times = ", ".join(f"{n} {format_time(m.times[n])}" for n in order)
            failed = "".join(f"; {n} failed: {why}" for n, why in m.failed.items())
            lines.append(f"{head}: {r.status}: {times}{failed}")
        return "\n".join(lines)


def candidates(problem: Problem, resolver: Any = None) -> list[Implementation]:
    """The implementations that accept `problem` and that the tuner times: every candidate of the resolver's
    ranking (no scope applies; the environment's deny list does) whose capability accepts it, less the
    last-resort ``reference``, those that are not `Implementation.graph_safe` (they keep their place in
    the priority order, after the measured ones) and those whose name another candidate (of another provider)
    carries too (a time under it could not say whose it is); in priority order."""
    resolver = resolver or _resolver()
    ex = resolver.explain(problem, ())
    by_key = {(i.provider, i.name): i for i in resolver.by_op.get(problem.op, ())}
    names = Counter(c.implementation for c in ex.candidates)
    found = [by_key.get((c.provider, c.implementation)) for c in ex.candidates
             if c.accepted and c.provider != _REFERENCE and names[c.implementation] == 1]
    return [i for i in found if i is not None and i.graph_safe]


class _OutOfTime(Exception):
    """The tuning budget was spent before a call of the implementation being timed."""


def _bounded(fn: Callable[[], Any], deadline: float) -> Callable[[], Any]:
    """`fn`, refusing to start (`_OutOfTime`) once `deadline` (``time.perf_counter``) has passed."""
    def call() -> Any:
        if time.perf_counter() > deadline:
            raise _OutOfTime
        return fn()
    return call


def _text(err: BaseException) -> str:
    """``Type: message`` of what an implementation raised (its message may itself raise)."""
    try:
        message = str(err)[:200]
    except BaseException:  # foreign code, even the message
        message = "(its message cannot be printed)"
    return f"{type(err).__name__}: {message}"


def _resolver() -> Any:
    return runtime.get_resolver()


def tune_calls(calls: Iterable[CapturedCall], *, force: bool = False, timer: Timer | None = None,
               budget_s: float = DEFAULT_BUDGET_S, save: bool = True, progress: Progress | None = None,
               resolver: Any = None) -> TuneReport:
    """Time every accepting implementation of each recorded call's problem bucket (see the module doc).

    The implementations run, many times each, on the recorded calls' own tensors: an operator that writes in
    place (a cache, a state, ``out=``, ``fused_add_rms_norm``'s ``x`` and ``residual``) leaves those tensors
    overwritten. Record the calls on tensors whose contents do not matter afterwards (infinilm's warm-up does,
    on its cache before any request), or tune synthetic inputs with `tune_problem`.

    Args:
        calls: recorded calls; one per problem is timed (the first), later ones of the same problem are ignored.
        force: time again the buckets this device already has times for.
        timer: ``(call, device type) -> median seconds``; default `infiniops_py.tuning.timer.measure`.
        budget_s: wall-time bound of the whole run in seconds, >= 0 (``inf``: none); what is left when it is
            spent is skipped (see the module doc).
        save: persist the new measurements in this machine's cache file.
        progress: called with ``(done, total, label)`` before each problem and once at the end.
        resolver: the resolver whose table receives the times (default: the runtime's).

    Returns:
        A `TuneReport` with one result per distinct problem.

    Raises:
        ValueError: `budget_s` is negative or NaN.
    """
    if not budget_s >= 0:  # NaN too: a deadline of NaN is never reached
        raise ValueError(f"budget_s={budget_s!r}: expected a number of seconds >= 0 (inf: no bound)")
    resolver = resolver or _resolver()
    timer = timer or measure
    start = time.perf_counter()
    report = TuneReport()
    todo: dict[Problem, CapturedCall] = {}
    for call in calls:
        todo.setdefault(call.problem, call)
    today = datetime.date.today().isoformat()
    new: list[Measurement] = []
    for n, (problem, call) in enumerate(todo.items()):
        if progress is not None:
            progress(n, len(todo), f"{problem.op} {problem.describe_bucket()}")
        report.results.append(_tune_one(problem, call, resolver, timer, force, start + budget_s, today, new))
    if new:
        resolver.tuning.add(new, save=save)
        resolver.cache.clear()  # decisions made before the times existed
    if progress is not None:
        progress(len(todo), len(todo), "done")
    report.seconds = time.perf_counter() - start
    return report


def _tune_one(problem: Problem, call: CapturedCall, resolver: Any, timer: Timer, force: bool, deadline: float,
              today: str, new: list[Measurement]) -> TuneResult:
    if not problem.bucket:
        return TuneResult(problem, "skipped", note="the operator has no size bucket")
    impls = candidates(problem, resolver)
    known = resolver.tuning.lookup(problem)
    if known is not None and not force and all(i.name in known.times or i.name in known.failed for i in impls):
        return TuneResult(problem, "reused", known)
    if not resolver.tuning.enabled:
        return TuneResult(problem, "skipped", note="INFINIOPS_TUNING=off")
    fp = resolver.tuning.fingerprint(problem.device_type)
    if fp is None:
        return TuneResult(problem, "skipped", note=f"no {problem.device_type} device on this machine")
    if len(impls) < 2:
        return TuneResult(problem, "skipped", note=f"{len(impls)} candidate(s): nothing to choose")
    if time.perf_counter() > deadline:
        return TuneResult(problem, "skipped", note="the tuning time budget was spent")
    if capturing():
        return TuneResult(problem, "skipped", note="a CUDA graph is being captured")
    times: dict[str, float] = {}
    failed: dict[str, str] = {}
    for impl in impls:
        fn = _bounded(functools.partial(impl.fn, *call.args, **call.kwargs), deadline)
        try:
            with torch.inference_mode():  # the calls were recorded in it (the engine's) or need no autograd
                seconds = timer(fn, problem.device_type)
        except CaptureError as err:
            return TuneResult(problem, "skipped", note=str(err))
        except _OutOfTime:  # a partial measurement would rank the untimed ones last: keep none
            return TuneResult(problem, "skipped", note=f"the tuning time budget was spent timing {impl.name}")
        except (Exception, SystemExit) as err:  # a provider's bug: recorded, never chosen by time
            failed[impl.name] = _text(err)
            continue
        if is_time(seconds):
            times[impl.name] = float(seconds)
        else:
            failed[impl.name] = f"the timer returned {seconds!r}, not a time in seconds >= 0"
    m = Measurement(problem, times, dict(call.sizes or _sizes(problem)), failed, fp.get("device", ""), today)
    new.append(m)
    return TuneResult(problem, "measured", m)


def _sizes(problem: Problem) -> Mapping[str, int]:
    return dict(problem.bucket)


def tune_problem(op: str, *, device: str = "cpu", dtype: str = "float32", sizes: Mapping[str, int] | None = None,
                 fields: Mapping[str, Any] | None = None, **options: Any) -> TuneReport:
    """Tune one operator problem on synthetic inputs of the given `sizes` (the bucket's sizes, plus the extra
    sizes the builder takes, `infiniops_py.tuning.inputs.SIZES`), built by `infiniops_py.tuning.inputs.build`.

    `options` go to `tune_calls`.

    Raises:
        KeyError: an unknown operator. ValueError, TypeError: an operator without a size bucket
            (``all_reduce``), or a field or size the builder or the operator's contract refuses (naming it).
    """
    call = inputs.build(op, device=device, dtype=dtype, sizes=sizes or {}, fields=fields or {})
    with recording() as calls:
        call.run()
    sized = [CapturedCall(c.spec, c.key, c.args, c.kwargs, call.sizes) for c in calls]
    return tune_calls(sized, **options)


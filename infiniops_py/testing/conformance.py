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

import contextlib
import dataclasses
import inspect
import math
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import hypothesis
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import HypothesisException

from infiniops_py import runtime
from infiniops_py.errors import GateError
from infiniops_py.operators import OPERATORS
from infiniops_py.problem import OpSpec
from infiniops_py.registry import Implementation, Provider
from infiniops_py.resolver import use
from infiniops_py.testing.case import Case, CaseContext, Draw
from infiniops_py.testing.compare import bits_equal, compare
from infiniops_py.testing.effects import Snapshot, check_result, check_returns, convention_of, guarded, recorded_calls
from infiniops_py.testing.gates import GateFailure, GateReport, check_gates
from infiniops_py.testing.tolerances import EXACT, Allclose, LowPrecisionRule, tolerance

__all__ = [
    "DTYPES",
    "Failure",
    "GateFailure",
    "GateReport",
    "OpReport",
    "Report",
    "allowed_share",
    "check_gates",
    "copies",
    "declared_pairs",
    "run_conformance",
    "serves_nothing",
]

DTYPES: Final = ("float16", "bfloat16", "float32")
NO_CUDA: Final = "no CUDA device on this machine (torch.cuda.is_available() is False)"
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


def _provider(name: str) -> tuple[Provider | None, str]:
    found = runtime.get_resolver().providers.get(name)
    if found is None:
        known = ", ".join(sorted(runtime.get_resolver().providers))
        return None, f"unknown provider {name!r} (known: {known}); is its package installed and allowed?"
    if found.error:
        return None, f"provider {name!r} failed to load: {found.error}"
    return found, ""


def _declared(impl: Implementation, device: str) -> list[str]:
    devices = impl.capability.values("device_type")
    if devices is not None and device not in devices:
        return []
    dtypes = impl.capability.values("dtype")
    return [d for d in DTYPES if dtypes is None or d in dtypes]


def declared_pairs(provider: str, device: str = "cpu", *, option: str = "--device"
                   ) -> tuple[list[tuple[str, str]], str]:
    """The (operator, dtype) pairs `provider` declares on `device`, or an error when it is not usable.

    The error also says when `device` is cuda and the machine has none, or when the provider serves
    nothing on `device` (then it names the devices it serves as `option` flags to try).
    """
    found, error = _provider(provider)
    if found is None:
        return [], error
    if device == "cuda" and not torch.cuda.is_available():
        return [], NO_CUDA
    pairs = {(i.op, d) for i in found.implementations if i.op in OPERATORS for d in _declared(i, device)}
    return sorted(pairs), "" if pairs else serves_nothing(found, device, option=option)


def serves_nothing(found: Provider, device: str, ops: Sequence[str] | None = None,
                   dtypes: Sequence[str] | None = None, *, option: str = "--device") -> str:
    """Why `found` has nothing to test on `device` among `ops` and `dtypes` (None: all), as one line.

    Names the devices its capabilities do serve as a `option` flag to try (``try --device cuda``).
    """
    head = f"provider {found.name!r} serves nothing to test on {device}"
    impls = [i for i in found.implementations if i.op in OPERATORS and (ops is None or i.op in ops)]
    if not impls:
        asked = f" among those asked ({', '.join(ops)})" if ops is not None else ""
        return f"{head}: it implements no operator{asked}"
    devices = [impl.capability.values("device_type") for impl in impls]
    if all(d is not None and device not in d for d in devices):
        served = sorted(set().union(*devices))
        tries = " or ".join(f"{option} {d}" for d in served)
        return f"{head}: device_type={device} not in {{{', '.join(served)}}}: try {tries}"
    declared = sorted({d for i in impls for d in _declared(i, device)}, key=DTYPES.index)
    if not declared:
        return f"{head}: it declares none of the dtypes {', '.join(DTYPES)}"
    return f"{head}: it declares {', '.join(declared)}, none of the dtypes asked ({', '.join(dtypes or ())})"


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
    from infiniops_py.testing.strategies import STRATEGIES

    report = Report(provider, device)
    ref_device = torch.device(reference_device or ("cuda" if device == "cuda" else "cpu"))
    scale = _Scale(device == "cuda" if large is None else large, ref_device)
    found, report.error = _provider(provider)
    if found is None:
        return report
    if device == "cuda" and not torch.cuda.is_available():
        report.error = NO_CUDA
        return report
    for impl in sorted(found.implementations, key=lambda i: (list(OPERATORS).index(i.op) if i.op in OPERATORS
                                                              else len(OPERATORS), i.name)):
        if impl.op not in OPERATORS or (ops is not None and impl.op not in ops):
            continue
        for dtype in _declared(impl, device):
            if dtypes is None or dtype in dtypes:
                op_report = OpReport(impl.op, dtype, impl.name)
                report.ops.append(op_report)
                strategy = STRATEGIES.get(impl.op)
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
            outcome = _check_case(provider, spec, case, tol, dev, dtype, data.draw, scale.reference_device)
        except HypothesisException:
            raise
        except Exception as err:  # a crashing strategy or reference is a failure, not a stop
            who = "the strategy" if case is None else "the reference"
            outcome = f"{who} raised {type(err).__name__}: {_first_line(err)}"
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


# --- one case ------------------------------------------------------------------------------------------

@contextlib.contextmanager
def poisoned() -> Iterator[None]:
    """Torch's deterministic mode with uninitialized memory filled (NaN for floats), restored afterwards."""
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*deterministic.*")
            yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill


def cpu_copies(tree: Any, float_dtype: torch.dtype | None) -> Any:
    """`copies` on the CPU."""
    return copies(tree, float_dtype, torch.device("cpu"))


def copies(tree: Any, float_dtype: torch.dtype | None, device: torch.device) -> Any:
    """Copy every tensor in `tree` (tuples, lists, dicts) to `device`, floats cast to `float_dtype`.

    Tensors that share storage stay views of one copied storage (same strides and offsets), so in-place
    arguments and views of a packed tensor keep their aliasing, and a tensor named twice (``add(a, b,
    out=a)``) is one copy named twice. Index tensors keep their dtype, and so do float8 tensors (an fp8 KV
    cache is the contract's storage format: the oracle reads it as it is, in float64 arithmetic).
    """
    bases: dict[tuple[int, torch.dtype], torch.Tensor] = {}
    made: dict[int, torch.Tensor] = {}

    def copy(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in made:
            made[id(t)] = _copy(t)
        return made[id(t)]

    def _copy(t: torch.Tensor) -> torch.Tensor:
        # 1-byte floats (fp8 KV caches) are a storage format, not a precision: they keep their dtype
        cast = float_dtype is not None and t.is_floating_point() and t.element_size() > 1
        target = float_dtype if cast else t.dtype
        key = (t.untyped_storage().data_ptr(), t.dtype)
        base = bases.get(key)
        if base is None:
            try:
                flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())
            except RuntimeError:
                return t.detach().to(device, target, copy=True)
            base = bases[key] = flat.detach().to(device, target, copy=True)
        return base.as_strided(t.shape, t.stride(), t.storage_offset())

    def walk(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return copy(x)
        if isinstance(x, (tuple, list)):
            return type(x)(walk(v) for v in x)
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        return x

    return walk(tree)


def _argument(spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any], key: int | str) -> Any:
    if isinstance(key, int):
        return args[key]
    if key in kwargs:
        return kwargs[key]
    return inspect.signature(spec.function).bind_partial(*args, **kwargs).arguments[key]


def _outputs(spec: OpSpec, case: Case, result: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
             ) -> list[tuple[str, torch.Tensor]]:
    if case.outputs is not None:
        return [(f"output {i}", t) for i, t in enumerate(case.outputs(result, args, kwargs))]
    if isinstance(result, torch.Tensor):
        out = [("result", result)]
    elif isinstance(result, (tuple, list)):
        out = [(f"result[{i}]", t) for i, t in enumerate(result) if isinstance(t, torch.Tensor)]
    else:
        out = []
    return out + [(f"mutated {m!r}", _argument(spec, args, kwargs, m)) for m in case.mutated]


def _takes_out(spec: OpSpec) -> bool:
    return "out" in inspect.signature(spec.function).parameters


def _named(spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by parameter name (those given, not the defaults)."""
    return dict(inspect.signature(spec.function).bind_partial(*args, **kwargs).arguments)


def _output_names(spec: OpSpec, case: Case, named: dict[str, Any]) -> list[str]:
    """The parameters the call may write: `Case.mutated` and ``out``."""
    params = list(inspect.signature(spec.function).parameters)
    names = [params[m] if isinstance(m, int) else m for m in case.mutated]
    return [*names, "out"] if "out" in named else names


def _check_case(provider: str, spec: OpSpec, case: Case, tol: Any, device: torch.device, dtype: torch.dtype,
                draw: Draw, ref_device: torch.device) -> tuple[float, float] | str:
    """Run one case; when it passes the worst error and its share of the allowed error (`allowed_share`),
    else ``"gated"`` or the failure message."""
    args64, kwargs64 = copies((case.args, dict(case.kwargs)), torch.float64, ref_device)
    with use("reference"), recorded_calls() as reference_calls:
        expected_result = spec.function(*args64, **kwargs64)
    rules = [convention_of(c) for c in reference_calls]
    expected = _outputs(spec, case, expected_result, args64, kwargs64)
    low: list[tuple[str, torch.Tensor]] | None = None
    if isinstance(tol, LowPrecisionRule):
        args_lo, kwargs_lo = copies((case.args, dict(case.kwargs)), None, ref_device)
        with use("reference"):
            low_result = spec.function(*args_lo, **kwargs_lo)
        low = _outputs(spec, case, low_result, args_lo, kwargs_lo)

    args, kwargs = case.args, dict(case.kwargs)
    poisoned_out = None
    if (_takes_out(spec) and "out" not in kwargs and isinstance(expected_result, torch.Tensor)
            and draw(st.booleans())):
        kwargs["out"] = torch.full(expected_result.shape, math.nan, dtype=dtype, device=device)
    args, kwargs = guarded((args, kwargs))  # a write past either end of an argument lands on poison
    if "out" in kwargs and "out" not in case.kwargs:
        poisoned_out = kwargs["out"]
    named = _named(spec, args, kwargs)
    snapshot = Snapshot({n: t for n, t in named.items() if isinstance(t, torch.Tensor)})
    before = [(u, _untouched_view(spec, args, kwargs, u).clone()) for u in case.untouched]

    try:
        with poisoned(), use(provider), recorded_calls() as calls:
            result = spec.function(*args, **kwargs)
    except GateError as err:
        return _gated(provider, err)
    except Exception as err:
        return f"{provider} raised {type(err).__name__}: {_first_line(err)}"

    message = (check_result(expected_result, _named(spec, args64, kwargs64), result, named, poisoned_out)
               or check_returns(provider, spec.name, rules, calls)
               or snapshot.stray_writes(_output_names(spec, case, named)))
    if message is not None:
        return message
    got = _outputs(spec, case, result, args, kwargs)
    exact = set(case.exact)
    if poisoned_out is not None:  # the out= the function was handed holds the result too
        if case.outputs is None and 0 in exact:
            exact.add(len(got))
        got.append(("out=", poisoned_out))
        expected.append(("out=", expected_result))
        if low is not None:
            low.append(("out=", low_result))
    if len(got) != len(expected):
        return f"{len(got)} outputs, the reference gives {len(expected)}"
    worst = share = 0.0
    for i, ((label, g), (_, r)) in enumerate(zip(got, expected)):
        err, message = compare(label, g, r, tol, k=case.k, low=None if low is None else low[i][1],
                               exact=i in exact)
        if message is not None:
            return message
        worst = max(worst, err)
        share = max(share, allowed_share(g, r, tol, k=case.k, low=None if low is None else low[i][1],
                                         exact=i in exact))
    for u, old in before:
        if not bits_equal(_untouched_view(spec, args, kwargs, u), old):
            return f"argument {u!r} changed although the contract leaves it untouched"
    return worst, share


def allowed_share(got: torch.Tensor, ref: torch.Tensor, tol: Allclose | LowPrecisionRule, *, k: int | None = None,
                  low: torch.Tensor | None = None, exact: bool = False) -> float:
    """The worst error of an output that passed `compare`, as a share of the error `tol` allows there.

    0 is exact, 1 is the limit. `Allclose`: the largest ``|got - ref| / (atol + atol_per_k * k + rtol * |ref|)``
    over the elements; `LowPrecisionRule`: the max abs error over ``factor * (the low-dtype reference's
    error) + atol``; bit-for-bit outputs give 0.
    """
    if exact or tol == EXACT or got.numel() == 0:
        return 0.0
    g, r = got.detach().to(ref.device, torch.float64), ref.detach().to(torch.float64)
    diff = torch.where((g == r) | (g.isnan() & r.isnan()), 0.0, (g - r).abs())
    if isinstance(tol, LowPrecisionRule):
        if low is None:
            return 0.0
        lo = low.detach().to(r.device, torch.float64)
        low_err = torch.where(lo.isfinite() & r.isfinite(), (lo - r).abs(), 0.0)
        return float(diff.max()) / (tol.factor * float(low_err.max()) + tol.atol)
    allowed = tol.atol + tol.atol_per_k * (k or 0) + tol.rtol * r.abs()
    return float(torch.where(diff == 0, 0.0, diff / allowed).max())


def _untouched_view(spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any], entry: Any) -> torch.Tensor:
    if isinstance(entry, tuple):
        key, index = entry
        return _argument(spec, args, kwargs, key)[index]
    return _argument(spec, args, kwargs, entry)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


def _gated(provider: str, err: GateError) -> str:
    for problem, candidates in err.gaps:
        mine = [c for c in candidates if c.provider == provider]
        if not mine:
            return f"GateError names no implementation of {provider} for {problem.op} {problem.describe()}:\n{err}"
        if any(c.accepted for c in mine):
            return f"GateError although {provider} accepts {problem.op} {problem.describe()}:\n{err}"
    return "gated"

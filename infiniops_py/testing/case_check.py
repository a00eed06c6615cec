"""One conformance case: the float64 reference run, the provider's run on guarded memory, and the checks.

`check_case` runs steps 1 to 4 of the conformance suite for one drawn `Case`: the reference on float64
copies (`copies`), the provider under `poisoned` memory with its arguments `guarded`, the checks of what
the call returned and wrote (`effects`), then the comparison with the tolerance (`compare`,
`allowed_share`).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from hypothesis import strategies as st

from infiniops_py.errors import GateError
from infiniops_py.operators.flash_attn import in_input_dtype
from infiniops_py.problem import OpSpec
from infiniops_py.resolver import use
from infiniops_py.testing.case import Case, Draw
from infiniops_py.testing.compare import bits_equal, compare
from infiniops_py.testing.effects import (
    Snapshot,
    check_result,
    check_returns,
    convention_of,
    guarded,
    map_tensors,
    recorded_calls,
)
from infiniops_py.testing.tolerances import EXACT, Allclose, LowPrecisionRule

__all__ = ["allowed_share", "check_case", "copies", "cpu_copies", "first_line", "poisoned"]


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

    return map_tensors(tree, copy)


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


def check_case(provider: str, spec: OpSpec, case: Case, tol: Any, device: torch.device, dtype: torch.dtype,
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
        with use("reference"), in_input_dtype():  # the rule's baseline: the reference in the low dtype
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
        return f"{provider} raised {type(err).__name__}: {first_line(err)}"

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


def first_line(err: BaseException) -> str:
    """The first line of `err`'s message, ``""`` for an empty one."""
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

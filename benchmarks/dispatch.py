"""Per-call overhead of InfiniOps-Py's dispatch, against calling the chosen implementation directly.

Two rows per operator, on tiny CPU tensors (so the kernel is as cheap as it gets and the overhead shows):

- dispatch: ``dispatch(spec, key, ...)`` (two contextvar reads, a dict lookup in the resolution cache, the call)
  against ``impl.fn(...)``;
- full call: the public function (contract checks, key, dispatch) against ``impl.fn(...)``.

Operators: `add` and `rms_norm` (whose checks read each tensor attribute once and call a check helper
only to raise; measured on a 2-core CI machine: full-call overhead 1.8 us for add, 1.85 us for rms_norm,
from 3.6 us before).

Each figure is the median over `rounds` rounds of `calls` calls of this thread's CPU time (so other
processes on a shared machine do not count; torch runs single-threaded here), rounds interleaving the
three paths, with the garbage collector off. The targets: at most 2 microseconds of overhead per call for
the dispatch path, 3 for the full public call.

    python benchmarks/dispatch.py [--rounds 20] [--calls 2000]

Exits 1 when the dispatch path's overhead exceeds the target.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

import infiniops_py as io
from infiniops_py import runtime
from infiniops_py.dispatch import Dispatched, dispatch, observing
from infiniops_py.operators import OpSpec

TARGET_US = 2.0  # the dispatch path (`infiniops_py.dispatch.dispatch`) over the implementation
FULL_TARGET_US = 3.0  # the whole public call (checks, lowering test, dispatch) over the implementation
Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def _cases() -> dict[str, Call]:
    """The public calls to time, for the operators that exist: (function, args, kwargs)."""
    a, b = torch.randn(8), torch.randn(8)
    x, w = torch.randn(2, 16), torch.randn(16)
    return {
        "add": (io.add, (a, b), {"out": torch.empty(8)}),
        "rms_norm": (io.rms_norm, (x, w, 1e-6), {"out": torch.empty(2, 16)}),
    }


def _capture(call: Call) -> tuple[OpSpec, tuple[Any, ...], tuple[Any, ...], dict[str, Any]]:
    """Run `call` once and record what it dispatches: (spec, key, implementation args, kwargs)."""
    seen: list[Dispatched] = []
    fn, args, kwargs = call
    with observing(seen.append):
        fn(*args, **kwargs)
    return seen[0].spec, seen[0].key, seen[0].args, seen[0].kwargs


def _per_call_us(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], calls: int) -> float:
    start = time.thread_time_ns()
    for _ in range(calls):
        fn(*args, **kwargs)
    return (time.thread_time_ns() - start) / calls / 1e3


def measure(call: Call, rounds: int, calls: int) -> dict[str, float]:
    """Median microseconds per call of the implementation, the dispatch path and the full public call."""
    spec, key, impl_args, impl_kwargs = _capture(call)
    impl = runtime.get_resolver().resolve_key(spec, key, ())
    fn, args, kwargs = call
    paths = {
        "direct": (impl.fn, impl_args, impl_kwargs),
        "dispatch": (dispatch, (spec, key, *impl_args), impl_kwargs),
        "full": (fn, args, kwargs),
    }
    samples: dict[str, list[float]] = {name: [] for name in paths}
    for f, a, k in paths.values():  # warm up
        _per_call_us(f, a, k, calls // 10 + 1)
    gc.disable()
    try:
        for _ in range(rounds):
            for name, (f, a, k) in paths.items():
                samples[name].append(_per_call_us(f, a, k, calls))
    finally:
        gc.enable()
    return {name: statistics.median(values) for name, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=2000)
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    table = Table(title=f"per-call overhead vs the implementation (median of {opts.rounds} x {opts.calls} calls, "
                        f"targets: dispatch <= {TARGET_US:g} us, full call <= {FULL_TARGET_US:g} us)")
    for column in ("operator", "implementation", "path", "impl us", "path us", "overhead us", "verdict"):
        table.add_column(column, justify="right" if column.endswith("us") else "left")
    dispatch_ok = True
    for op, call in _cases().items():
        spec, key, _, _ = _capture(call)
        name = runtime.get_resolver().resolve_key(spec, key, ()).name
        t = measure(call, opts.rounds, opts.calls)
        for path, label in (("dispatch", "dispatch (dispatch())"), ("full", "full call (checks + dispatch)")):
            overhead = t[path] - t["direct"]
            ok = overhead <= (TARGET_US if path == "dispatch" else FULL_TARGET_US)
            dispatch_ok &= ok or path != "dispatch"
            verdict = "[green]ok[/green]" if ok else "[red]over[/red]"
            table.add_row(op, name, label, f"{t['direct']:.2f}", f"{t[path]:.2f}", f"{overhead:.2f}", verdict)
    Console().print(table)
    return 0 if dispatch_ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""The ``infiniops`` command: providers, the capability matrix, explanations and conformance checks.

    infiniops providers
    infiniops matrix [--device D] [--op OP] [--format table|json|markdown|html] [--write DIR]
    infiniops explain OP --device D --dtype T [--head-dim N] [--block-size N] [--width N] [--field k=v ...]
    infiniops check PROVIDER [--device D] [--max-examples N] [--op OP] [--dtype T] [--seed S]
                   [--reference-device {cpu,cuda}] [--json FILE] [--progress]

Exit status: 0 on success, 1 when `explain` finds no provider or `check` finds a failure, 2 on bad usage
(including an ``INFINIOPS_*`` switch set to a value it does not accept, such as ``INFINIOPS_STRICT=maybe``).
Plugin code runs with ``sys.stdout`` sent to stderr, so that stdout carries only the command's output.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infiniops_py._env import EnvValueError

__all__ = ["main"]

_SHORTCUTS = (("head_dim", "--head-dim"), ("block_size", "--block-size"), ("width", "--width"))


def _console() -> Console:
    # a pipe or a test gets wide tables instead of wrapped 80-column ones
    return Console(width=None if sys.stdout.isatty() else 200, highlight=False)


def _positive(text: str) -> int:
    """argparse type of a count or a size: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="infiniops", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("providers", help="list the providers: version, source, loaded or the load error")

    matrix = sub.add_parser("matrix", help="operators x providers x devices x dtypes")
    matrix.add_argument("--device", action="append", help="a device type (repeatable; default: cpu and cuda)")
    matrix.add_argument("--op", action="append", help="an operator (repeatable; default: all)")
    matrix.add_argument("--format", choices=("table", "json", "markdown", "html"), default=None,
                        help="what to print (default: table, or nothing with --write)")
    matrix.add_argument("--write", metavar="DIR", help="write DIR/matrix.json, DIR/MATRIX.md and DIR/index.html")

    explain = sub.add_parser("explain", help="rank the providers for one problem and say why")
    explain.add_argument("op")
    explain.add_argument("--device", default="cpu", help="device type (default: cpu)")
    explain.add_argument("--dtype", default="float32", help="dtype (default: float32)")
    for field, flag in _SHORTCUTS:
        explain.add_argument(flag, dest=field, type=_positive, default=None, help=f"problem field {field} (>= 1)")
    explain.add_argument("--field", action="append", default=[], metavar="K=V", help="any other problem field")

    check = sub.add_parser("check", help="run the conformance suite on a provider")
    check.add_argument("provider")
    check.add_argument("--device", default="cpu", help="device type (default: cpu)")
    check.add_argument("--max-examples", type=_positive, default=200,
                       help="hypothesis examples per (implementation, dtype) (default: 200)")
    check.add_argument("--op", action="append", help="an operator (repeatable; default: all)")
    check.add_argument("--dtype", action="append", help="a dtype (repeatable; default: all declared)")
    check.add_argument("--seed", type=int, default=None, help="fix the random draws (replay a failing run)")
    check.add_argument("--reference-device", choices=("cpu", "cuda"), default=None,
                       help="where the float64 reference runs (default: the device under test when it is "
                            "cuda, else cpu)")
    check.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")
    check.add_argument("--progress", action="store_true",
                       help="print a line per example to stderr (row, count, seconds, case) as it runs")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command `argv` (default: ``sys.argv[1:]``); returns the exit status (see the module doc).

    Raises:
        SystemExit: with status 2, from argparse, on bad arguments.
    """
    args = _parser().parse_args(argv)
    command = {"providers": _providers, "matrix": _matrix, "explain": _explain, "check": _check}[args.command]
    try:
        return command(args)
    except EnvValueError as err:  # an INFINIOPS_* switch holds a value no parser accepts: usage, not a crash
        print(f"infiniops {args.command}: {err}", file=sys.stderr)
        return 2


# --- providers ------------------------------------------------------------------------------------------

def _providers(args: argparse.Namespace) -> int:
    from infiniops_py import runtime

    table = Table(title="InfiniOps-Py providers")
    for column in ("provider", "version", "source", "implementations", "status"):
        table.add_column(column)
    found = sorted(runtime.providers(), key=lambda p: (p.name == "reference", p.name))
    for p in found:
        status = "[red]failed to load (below)[/red]" if p.error else "[green]loaded[/green]"
        table.add_row(escape(p.name), escape(p.version), escape(p.source), str(len(p.implementations)), status)
    console = _console()
    console.print(table)
    for p in found:
        if p.error:  # one unwrapped line each: errors are long and get copied into bug reports
            console.print(f"[red]{escape(p.name)} failed to load:[/red] {escape(p.error)}", soft_wrap=True)
    return 0


# --- matrix ---------------------------------------------------------------------------------------------

def _matrix(args: argparse.Namespace) -> int:
    from infiniops_py import matrix

    try:
        with contextlib.redirect_stdout(sys.stderr):  # plugin constraints run here: stdout is for the matrix
            m = matrix.build(ops=args.op, devices=args.device or matrix.DEVICES)
    except KeyError as err:
        print(f"infiniops matrix: {err.args[0]}", file=sys.stderr)
        return 2
    if args.write:
        try:
            written = matrix.write(m, args.write)
        except OSError as err:
            print(f"infiniops matrix: cannot write {args.write}: {err.strerror or err}", file=sys.stderr)
            return 2
        for path in written:
            print(f"wrote {path}")
    fmt = args.format or (None if args.write else "table")
    if fmt == "json":
        sys.stdout.write(matrix.to_json(m))
    elif fmt == "markdown":
        sys.stdout.write(matrix.to_markdown(m))
    elif fmt == "html":
        sys.stdout.write(matrix.to_html(m))
    elif fmt == "table":
        _matrix_tables(m)
    return 0


def _matrix_tables(m: Any) -> None:
    console = _console()
    failed = [p for p in m.providers if p.error]
    for op, doc in m.operators:
        table = Table(title=escape(f"{op}: {doc}" if doc else op), title_justify="left")
        table.add_column("provider")
        for dev in m.devices:
            for dt in m.dtypes:
                table.add_column(f"{dev}\n{dt}")
        table.add_column("limits")
        for r in m.rows_of(op):
            cells = ["[green]served[/green]" if c.served else f"[red]gated[/red]: {escape('; '.join(c.reasons))}"
                     for c in r.cells]
            table.add_row(escape(r.provider), *cells, escape("\n".join(r.limits) or "-"))
        console.print(table)
    for p in failed:
        console.print(f"[red]provider {escape(p.name)} failed to load[/red]: {escape(p.error)}")


# --- explain --------------------------------------------------------------------------------------------

def _value(text: str, default: Any) -> Any:
    if isinstance(default, bool) or text.lower() in ("true", "false"):
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"expected true or false, got {text!r}")
        return text.lower() in ("true", "1")
    for kind in (int, float):
        if isinstance(default, kind) or default is None:
            try:
                return kind(text)
            except ValueError:
                if default is not None:
                    raise
    return text


def _explain(args: argparse.Namespace) -> int:
    from infiniops_py import runtime
    from infiniops_py.operators import OPERATORS

    spec = OPERATORS.get(args.op)
    if spec is None:
        print(f"infiniops explain: unknown operator {args.op!r}; known: {', '.join(OPERATORS)}", file=sys.stderr)
        return 2
    fields: dict[str, Any] = {name: getattr(args, name) for name, _ in _SHORTCUTS if getattr(args, name) is not None}
    try:
        for item in args.field:
            name, sep, text = item.partition("=")
            if not sep:
                raise ValueError(f"--field {item!r}: expected K=V")
            try:
                fields[name] = _value(text, spec.fields.get(name))
            except ValueError as err:
                raise ValueError(f"--field {item!r}: {err}") from None
        if fields.get("block_size") and "paged" in spec.fields:
            fields.setdefault("paged", True)  # a block size means a paged cache, unless --field paged= says
        problem = runtime.make_problem(args.op, device_type=args.device, dtype=args.dtype, **fields)
    except (TypeError, ValueError) as err:
        print(f"infiniops explain: {err}", file=sys.stderr)
        return 2
    ex = runtime.explain(problem)
    print(ex.render())  # with the most likely fix when nothing serves the problem
    if ex.chosen is not None:
        print(f"  -> {ex.chosen.provider} serves it ({ex.chosen.name})")
        return 0
    return 1


# --- check ----------------------------------------------------------------------------------------------

def _check_usage(args: argparse.Namespace) -> str:
    """What is wrong with the arguments of `check` before anything runs (empty when nothing is)."""
    import torch

    if args.reference_device == "cuda" and not torch.cuda.is_available():
        return "--reference-device cuda: this machine has no CUDA device"
    if args.json and not Path(args.json).resolve().parent.is_dir():
        return f"--json {args.json}: the folder {Path(args.json).resolve().parent} does not exist"
    return ""


def _print_progress(row: Any, seconds: float, note: str, outcome: str) -> None:
    """One line per example on stderr, flushed: a job killed midway still shows how far it got."""
    print(f"{row.op} {row.dtype} #{row.examples} {seconds:.2f}s {outcome[:80]} | {note[:120]}", file=sys.stderr,
          flush=True)


def _check(args: argparse.Namespace) -> int:
    from infiniops_py.testing.conformance import NOTHING_RAN, run_conformance

    usage = _check_usage(args)
    if usage:
        print(f"infiniops check: {usage}", file=sys.stderr)
        return 2
    report = run_conformance(args.provider, device=args.device, ops=args.op, max_examples=args.max_examples,
                             seed=args.seed, dtypes=args.dtype, reference_device=args.reference_device,
                             progress=_print_progress if args.progress else None)
    if args.json:
        try:
            with open(args.json, "w") as f:
                json.dump(report.as_dict(), f, indent=1, default=str)
        except OSError as err:
            print(f"infiniops check: cannot write --json {args.json}: {err.strerror or err}", file=sys.stderr)
            return 2
    console = _console()
    if report.error:
        console.print(f"[red]{escape(report.error)}[/red]")
        return 1
    table = Table(title=f"conformance of {args.provider} on {args.device} ({args.max_examples} examples per row)")
    for column in ("operator", "dtype", "implementation"):
        table.add_column(column)
    for column in ("run", "gated", "failed", "worst |err|", "worst err / allowed"):
        table.add_column(column, justify="right")
    for r in report.ops:
        failed = f"[red]{r.failed}[/red]" if r.failed else "0"
        share = "-" if r.failed or r.examples == r.gated else f"{r.worst_allowed:.2f}"
        table.add_row(r.op, r.dtype, escape(r.implementation), str(r.examples), str(r.gated), failed,
                      f"{r.worst:.3g}", share)
    console.print(table)
    console.print("worst err / allowed: the largest error of the passing cases over the error the tolerance "
                  "allows there (infiniops_py/testing/tolerances.py); 1 is the limit")
    for r in report.ops:
        drawn = r.render_coverage()
        if drawn:
            console.print(f"drawn {r.op} {r.dtype} ({r.seconds:.1f} s): {escape(drawn)}")
    if report.gates is not None:
        console.print(f"gate checks: {report.gates.checked} problems outside the capability, "
                      f"{len(report.gates.failures)} not rejected with GateError")
    for r in report.ops:
        for f in r.failures:
            console.print(f"[red]FAIL[/red] {r.op} {r.dtype} ({escape(r.implementation)}): {escape(str(f))}")
    for g in report.gates.failures if report.gates is not None else ():
        console.print(f"[red]FAIL[/red] gate {escape(str(g))}")
    if not report.ran:
        console.print(f"[red]{escape(NOTHING_RAN)}[/red]")
    console.print("[green]ok[/green]" if report.ok else "[red]FAILED[/red]")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

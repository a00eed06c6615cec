"""The ``infiniops`` command: providers, the capability matrix, explanations and conformance checks.

    infiniops --version
    infiniops providers
    infiniops matrix [--device D] [--op OP] [--format table|json|markdown|html] [--write DIR] [--wide]
                     [--all-providers]
    infiniops explain OP --device D --dtype T [--head-dim N] [--block-size N] [--width N] [--field k=v ...]
    infiniops check PROVIDER [--device D] [--max-examples N] [--op OP] [--dtype T] [--seed S]
                   [--reference-device {cpu,cuda}] [--json FILE] [--progress]

``matrix`` prints a compact table that fits the terminal (``COLUMNS``, else the terminal's width, else 80
columns): per operator, the dtypes each provider serves on each device, and the limits; ``--wide`` prints
every (device, dtype) cell with its reason, as wide as it needs. Rows that serve nothing on the devices
shown are left out (and counted) unless ``--all-providers``. A machine format goes to stdout, or with
``--write DIR`` only its file goes to DIR; ``--write DIR`` alone writes the three files.

Exit status: 0 on success, 1 when `explain` finds no provider or `check` finds a failure, 2 on bad usage
(including an ``INFINIOPS_*`` switch set to a value it does not accept, such as ``INFINIOPS_STRICT=maybe``).
Plugin code runs with ``sys.stdout`` sent to stderr, so that stdout carries only the command's output.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infiniops_py._env import EnvValueError
from infiniops_py._version import __version__

try:  # the cli extra: without it, the commands that print tables say what to install
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
except ImportError:
    Console = Table = escape = None  # type: ignore[assignment,misc]

_NO_RICH = "needs the cli extra (rich) to print its tables: pip install 'infiniops-py[cli]'"

__all__ = ["main"]

_SHORTCUTS = (("head_dim", "--head-dim"), ("block_size", "--block-size"), ("width", "--width"))


def _columns() -> int | None:
    """``COLUMNS`` when it is a whole number >= 1, else None."""
    text = os.environ.get("COLUMNS", "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def _console(*, pipe_width: int = 200) -> Console:
    """A console of ``COLUMNS`` columns when set, else the terminal's width, else (a pipe, a log)
    `pipe_width`: lines such as load errors then stay whole."""
    width = _columns() or (None if sys.stdout.isatty() else pipe_width)
    return _new_console(width)


def _new_console(width: int | None) -> Console:
    """A rich console whose broken pipe (the reader of stdout left) raises `BrokenPipeError` for `main`, where
    rich's own handler would exit with status 1."""
    console = Console(width=width, highlight=False)

    def reader_left() -> None:
        raise BrokenPipeError("stdout's reader left")

    console.on_broken_pipe = reader_left  # type: ignore[method-assign]
    return console


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
    parser.add_argument("--version", action="version", version=f"infiniops-py {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("providers", help="list the providers: version, source, loaded or the load error")

    matrix = sub.add_parser("matrix", help="operators x providers x devices x dtypes")
    matrix.add_argument("--device", action="append", help="a device type (repeatable; default: cpu and cuda)")
    matrix.add_argument("--op", action="append", help="an operator (repeatable; default: all)")
    matrix.add_argument("--format", choices=("table", "json", "markdown", "html"), default=None,
                        help="what to print: table (the default), or a machine format (to stdout, or with "
                             "--write only its file)")
    matrix.add_argument("--write", metavar="DIR",
                        help="write the --format's file into DIR (matrix.json, MATRIX.md or index.html), or all "
                             "three without --format")
    matrix.add_argument("--wide", action="store_true",
                        help="the full table: a column per (device, dtype), with the reason of each gated cell")
    matrix.add_argument("--all-providers", action="store_true",
                        help="also the rows of providers that serve nothing on the devices shown (and, in the "
                             "machine formats, the providers that do not implement an operator)")

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
    tables = args.command in ("providers", "check") or (args.command == "matrix" and not args.write
                                                         and args.format in (None, "table"))
    if tables and Console is None:
        print(f"infiniops {args.command}: {_NO_RICH}", file=sys.stderr)
        return 2
    try:
        status = command(args)
        sys.stdout.flush()  # here, so that a reader that left (`infiniops matrix | head`) is seen below
        return status
    except EnvValueError as err:  # an INFINIOPS_* switch holds a value no parser accepts: usage, not a crash
        print(f"infiniops {args.command}: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of stdout left early: not a failure of the command
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 0


# --- providers ------------------------------------------------------------------------------------------

def _providers(args: argparse.Namespace) -> int:
    from infiniops_py import runtime

    table = Table(title="InfiniOps-Py providers")
    for column in ("provider", "version", "source", "implementations", "status"):
        table.add_column(column)
    found = sorted(runtime.providers(), key=lambda p: (p.name == "reference", p.name))
    for p in found:
        missing = _missing_imports(p)
        status = ("[red]failed to load (below)[/red]" if p.error else
                  f"[yellow]loaded; cannot run: {escape(missing)}[/yellow]" if missing else "[green]loaded[/green]")
        table.add_row(escape(p.name), escape(p.version), escape(p.source), str(len(p.implementations)), status)
    console = _console()
    console.print(table)
    for p in found:
        if p.error:  # one unwrapped line each: errors are long and get copied into bug reports
            console.print(f"[red]{escape(p.name)} failed to load:[/red] {escape(p.error)}", soft_wrap=True)
    return 0


def _missing_imports(p: Any) -> str:
    """What every implementation of a loaded provider needs and cannot import (``cupy is not importable (fix:
    pip install ...)``), or '' (a provider whose package, such as CuPy, is simply not installed here)."""
    from infiniops_py.capability import Requires
    from infiniops_py.operators import OPERATORS

    common: dict[str, str] | None = None
    for impl in p.implementations:
        spec = OPERATORS.get(impl.op)
        problem = spec.problem() if spec is not None else None
        found = {}
        for c in impl.capability.constraints:
            rejection = c.reject(problem) if isinstance(c, Requires) and problem is not None else None
            if rejection is not None:
                found[c.module] = f"{c.module} is not importable (fix: {rejection.fix})"
        common = found if common is None else {k: v for k, v in common.items() if k in found}
    return "; ".join((common or {}).values())


# --- matrix ---------------------------------------------------------------------------------------------

def _matrix(args: argparse.Namespace) -> int:
    from infiniops_py import matrix

    fmt = args.format or ("table" if not args.write else None)
    if args.write and fmt == "table":
        print("infiniops matrix: --format table prints to the terminal; --write takes json, markdown or html "
              "(or no --format, for all three)", file=sys.stderr)
        return 2
    try:
        with contextlib.redirect_stdout(sys.stderr):  # plugin constraints run here: stdout is for the matrix
            m = matrix.build(ops=args.op, devices=args.device or matrix.DEVICES,
                             unimplemented=args.all_providers)
    except KeyError as err:
        print(f"infiniops matrix: {err.args[0]}", file=sys.stderr)
        return 2
    if args.write:
        try:
            written = matrix.write(m, args.write, [fmt] if fmt else tuple(matrix.FILES))
        except OSError as err:
            print(f"infiniops matrix: cannot write {args.write}: {err.strerror or err}", file=sys.stderr)
            return 2
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
        return 0
    if fmt == "table":
        _matrix_tables(m, wide=args.wide, every_row=args.all_providers)
    else:
        sys.stdout.write({"json": matrix.to_json, "markdown": matrix.to_markdown, "html": matrix.to_html}[fmt](m))
    return 0


_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}


def _compact_limits(row: Any) -> list[str]:
    """A row's limits without the provider's name: the constraints alone for one implementation, else each
    implementation's name less the ``provider.`` prefix, then its constraints; '-' for none."""
    parts = [text.partition(": ") for text in row.limits]
    if len(parts) == 1:
        return [parts[0][2].replace("no other limits", "-")]
    return [f"{name.removeprefix(row.provider + '.')}: {text}" for name, _, text in parts]


def _matrix_tables(m: Any, *, wide: bool, every_row: bool) -> None:
    """The matrix on the terminal: compact (one table, a row per operator and provider, the dtypes served per
    device; fits the console) or `wide` (a table per operator, a column per cell with the gate reasons, no
    width limit). Rows serving nothing on the devices shown are left out unless `every_row`."""
    from rich import box

    console = _new_console(100_000) if wide else _console(pipe_width=80)
    shown = [r for r in m.rows if every_row or any(c.served for c in r.cells)]
    hidden = list(dict.fromkeys(r.provider for r in m.rows if r not in shown))
    if wide:
        for op, doc in m.operators:
            table = Table(title=escape(f"{op}: {doc}" if doc else op), title_justify="left")
            table.add_column("provider")
            for dev in m.devices:
                for dt in m.dtypes:
                    table.add_column(f"{dev}\n{dt}")
            table.add_column("compute\ncapability")
            table.add_column("limits")
            for r in (r for r in shown if r.op == op):
                cells = ["[green]served[/green]" if c.served else f"[red]gated[/red]: {escape('; '.join(c.reasons))}"
                         for c in r.cells]
                table.add_row(escape(r.provider), *cells, r.compute_capability_text(),
                              escape("\n".join(r.limits) or "-"))
            console.print(table)
    else:  # a table per operator, its name as the title; the same column widths in every table
        served = {(r, dev): " ".join(_SHORT.get(c.dtype, c.dtype) for c in r.cells if c.device == dev and c.served)
                  or "-" for r in shown for dev in m.devices}
        widths = [max([len("provider"), *(len(r.provider) for r in shown)]),
                  *(max([len(dev), *(len(served[r, dev]) for r in shown)]) for dev in m.devices)]
        names = ", ".join(f"{short} = {dt}" for dt, short in _SHORT.items() if dt in m.dtypes)
        console.print(f"Each device column lists the dtypes served ({names}; - none). --wide: every cell and why "
                      "it is gated; infiniops explain OP --device D --dtype T: one problem.")
        first = True
        for op, _ in m.operators:
            rows = [r for r in shown if r.op == op]
            if not rows:
                continue
            table = Table(title=f"[bold]{escape(op)}[/bold]", title_justify="left", box=box.SIMPLE_HEAD,
                          pad_edge=False, show_edge=False, show_header=first, expand=True)
            for name, width in zip(("provider", *m.devices), widths):
                table.add_column(name, width=width, no_wrap=True)
            table.add_column("limits", ratio=1, overflow="fold")  # a long name folds, never ends in an ellipsis
            for r in rows:
                limits = [*_compact_limits(r), *(f"compute capability >= {cc}" for cc in r.compute_capability)]
                table.add_row(escape(r.provider), *(served[r, dev] for dev in m.devices), escape("\n".join(limits)))
            console.print(table)
            first = False
    if hidden:
        console.print(f"Not shown: rows of {', '.join(hidden)} that serve nothing on {', '.join(m.devices)} "
                      "(--all-providers shows them).")
    for p in m.providers:
        if p.error:
            console.print(f"[red]provider {escape(p.name)} failed to load[/red]: {escape(p.error)}", soft_wrap=wide)


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
    try:
        from infiniops_py.testing.conformance import NOTHING_RAN, run_conformance
    except ImportError as err:
        if err.name != "hypothesis":
            raise
        print("infiniops check: needs the test extra (hypothesis): pip install 'infiniops-py[test]'", file=sys.stderr)
        return 2

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

"""``infiniops check``: run the conformance suite on a provider and print its report."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from infiniops_py.cli._command import Command, device, dtype, positive
from infiniops_py.cli._console import Table, escape, stdout_console

__all__ = ["COMMAND"]

_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}


def _arguments(parser: argparse.ArgumentParser) -> None:
    """``PROVIDER``, ``--device``, ``--max-examples``, ``--op``, ``--dtype``, ``--seed``, ``--reference-device``,
    ``--json``, ``--progress``."""
    parser.add_argument("provider", help="the provider to test (infiniops providers lists them)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--max-examples", type=positive, default=200,
                        help="hypothesis examples per (implementation, dtype) (default: 200)")
    parser.add_argument("--op", action="append", help="an operator (repeatable; default: all)")
    parser.add_argument("--dtype", action="append", help="a dtype (repeatable; default: all declared)")
    parser.add_argument("--seed", type=int, default=None, help="fix the random draws (replay a failing run)")
    parser.add_argument("--reference-device", choices=("cpu", "cuda"), default=None,
                        help="where the float64 reference runs (default: the device under test when it is "
                             "cuda, else cpu)")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")
    parser.add_argument("--progress", action="store_true",
                        help="print a line per example to stderr (row, count, seconds, case) as it runs")


def _check_usage(args: argparse.Namespace) -> str:
    """What is wrong with the arguments of `check` before anything runs (empty when nothing is)."""
    import torch

    try:
        if device(args.device) != device(args.device).partition(":")[0]:
            return (f"--device {args.device}: the suite runs on the current CUDA device: use --device cuda "
                    "(CUDA_VISIBLE_DEVICES picks which)")
        args.dtype = [dtype(d) for d in args.dtype] if args.dtype else None
    except ValueError as err:
        return str(err)
    if args.reference_device == "cuda" and not torch.cuda.is_available():
        return "--reference-device cuda: this machine has no CUDA device"
    if args.json and not Path(args.json).resolve().parent.is_dir():
        return f"--json {args.json}: the folder {Path(args.json).resolve().parent} does not exist"
    return ""


def _print_progress(row: Any, seconds: float, note: str, outcome: str) -> None:
    """One line per example on stderr, flushed: a job killed midway still shows how far it got."""
    print(f"{row.op} {row.dtype} #{row.examples} {seconds:.2f}s {outcome[:80]} | {note[:120]}", file=sys.stderr,
          flush=True)


class _RowLines:
    """The progress of ``infiniops check`` on a terminal without ``--progress``: a line on stderr per (operator,
    dtype, implementation) row as it ends, with its examples, failures and seconds."""

    def __init__(self) -> None:
        self.row: Any = None
        self.rows = 0

    def __call__(self, row: Any, seconds: float, note: str, outcome: str) -> None:
        if row is not self.row:
            self.finish()
            self.row = row

    def finish(self) -> None:
        """The line of the row that ran last (the suite calls back per example, so a row ends when the next
        one starts, or when the suite does)."""
        if self.row is not None:
            r, self.row = self.row, None
            self.rows += 1
            failed = f", {r.failed} FAILED" if r.failed else ""
            print(f"checked {r.op} {r.dtype} ({r.implementation}): {r.examples} examples{failed} "
                  f"[{self.rows} rows done]", file=sys.stderr, flush=True)


def _run(args: argparse.Namespace) -> int:
    """Run the suite and print its report; returns 0 when it passes, 1 on a failure, 2 on bad usage."""
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
    rows = _RowLines() if not args.progress and sys.stderr.isatty() else None
    report = run_conformance(args.provider, device=args.device, ops=args.op, max_examples=args.max_examples,
                             seed=args.seed, dtypes=args.dtype, reference_device=args.reference_device,
                             progress=_print_progress if args.progress else rows)
    if rows is not None:
        rows.finish()
    if args.json:
        try:
            with open(args.json, "w") as f:
                json.dump(report.as_dict(), f, indent=1, default=str)
        except OSError as err:
            print(f"infiniops check: cannot write --json {args.json}: {err.strerror or err}", file=sys.stderr)
            return 2
    console = stdout_console()
    if report.error:
        console.print(f"[red]{escape(report.error)}[/red]")
        return 1
    # the operator above its implementation in one cell, short dtypes and two-line headers: a row of the
    # longest names (torch.fused_add_rms_norm) fits in 80 columns; longer ones fold, never end in an ellipsis
    table = Table(title=f"conformance of {args.provider} on {args.device} ({args.max_examples} examples per row)")
    table.add_column("operator\nimplementation", overflow="fold")
    table.add_column("dtype", vertical="bottom")
    for column in ("run", "gated", "failed", "worst\n|err|", "err /\nallowed"):
        table.add_column(column, justify="right", overflow="fold", vertical="bottom")
    for r in report.ops:
        failed = f"[red]{r.failed}[/red]" if r.failed else "0"
        share = "-" if r.failed or r.examples == r.gated else f"{r.worst_allowed:.2f}"
        table.add_row(f"{r.op}\n{escape(r.implementation)}", _SHORT.get(r.dtype, r.dtype), str(r.examples),
                      str(r.gated), failed, f"{r.worst:.3g}", share)
    console.print(table)
    console.print("err / allowed: the worst error of the passing cases over the error the tolerance "
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


COMMAND = Command("check", "run the conformance suite on a provider", _arguments, _run,
                  prints_tables=lambda args: True)

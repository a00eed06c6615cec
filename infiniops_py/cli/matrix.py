"""``infiniops matrix``: the capability matrix on the terminal, in a machine format on stdout, or as files.

The table fits the terminal (``COLUMNS``, else the terminal's width, else 80 columns); ``--wide`` prints every
(device, dtype) cell with its reason. A machine format goes to stdout, or with ``--write DIR`` only its file
goes to DIR; ``--write DIR`` alone writes the three files.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from infiniops_py.cli._command import Command, device
from infiniops_py.cli._matrix_tables import print_tables

__all__ = ["COMMAND"]


def _arguments(parser: argparse.ArgumentParser) -> None:
    """``--device``, ``--op``, ``--format``, ``--write``, ``--wide``, ``--all-providers``."""
    parser.add_argument("--device", action="append", help="cpu or cuda (repeatable; default: both)")
    parser.add_argument("--op", action="append", help="an operator (repeatable; default: all)")
    parser.add_argument("--format", choices=("table", "json", "markdown", "html"), default=None,
                        help="what to print: table (the default), or a machine format (to stdout, or with "
                             "--write only its file)")
    parser.add_argument("--write", metavar="DIR",
                        help="write the --format's file into DIR (matrix.json, MATRIX.md or index.html), or all "
                             "three without --format")
    parser.add_argument("--wide", action="store_true",
                        help="the full table: a column per (device, dtype), with the reason of each gated cell")
    parser.add_argument("--all-providers", action="store_true",
                        help="also the rows of providers that serve nothing on the devices shown (and, in the "
                             "machine formats, the providers that do not implement an operator)")


def _run(args: argparse.Namespace) -> int:
    """Build the matrix, then print its tables or a machine format, or write its files (see the module doc)."""
    from infiniops_py import matrix

    fmt = args.format or ("table" if not args.write else None)
    if args.write and fmt == "table":
        print("infiniops matrix: --format table prints to the terminal; --write takes json, markdown or html "
              "(or no --format, for all three)", file=sys.stderr)
        return 2
    try:  # a column per device type: cuda:1 is cuda
        devices = list(dict.fromkeys(device(d).partition(":")[0] for d in args.device or matrix.DEVICES))
        with contextlib.redirect_stdout(sys.stderr):  # plugin constraints run here: stdout is for the matrix
            m = matrix.build(ops=args.op, devices=devices, unimplemented=args.all_providers)
    except (KeyError, ValueError) as err:
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
        print_tables(m, wide=args.wide, every_row=args.all_providers)
    else:
        sys.stdout.write({"json": matrix.to_json, "markdown": matrix.to_markdown, "html": matrix.to_html}[fmt](m))
    return 0


def _prints_tables(args: argparse.Namespace) -> bool:
    """The terminal table, unless a machine format or ``--write`` is asked for."""
    return not args.write and args.format in (None, "table")


COMMAND = Command("matrix", "operators x providers x devices x dtypes", _arguments, _run, _prints_tables)

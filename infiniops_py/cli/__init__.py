"""The ``infiniops`` command: providers, the capability matrix, explanations and conformance checks.

    infiniops --version
    infiniops providers [--format table|json]
    infiniops matrix [--device D] [--op OP] [--format table|json|markdown|html] [--write DIR] [--wide]
                     [--all-providers]
    infiniops explain OP [--device D] [--dtype T] [--head-dim N] [--block-size N] [--conv-width N]
                     [--field k=v ...]
    infiniops check PROVIDER [--device D] [--max-examples N] [--op OP] [--dtype T] [--seed S]
                   [--reference-device {cpu,cuda}] [--json FILE] [--progress]
    infiniops tune OP [--device D] [--dtype T] [--size K=N ...] [--field K=V ...] [--force] [--budget S]
                   [--write FILE]

Output folds to the terminal's width (``COLUMNS``, else the terminal's), never cutting a name or a reason.
Without the cli extra (rich), ``providers`` prints a plain table; ``matrix`` and ``check`` say what to install.
A device is ``cpu``, ``cuda`` or ``cuda:N``; an unknown device or dtype is bad usage, naming the known ones.
On a terminal, ``check`` and ``tune`` print a line per row or problem bucket to stderr as they go.

``matrix`` prints a compact table that fits the terminal (``COLUMNS``, else the terminal's width, else 80
columns): per operator, the dtypes each provider serves on each device, and the limits; ``--wide`` prints
every (device, dtype) cell with its reason, as wide as it needs. Rows that serve nothing on the devices
shown are left out (and counted) unless ``--all-providers``. A machine format goes to stdout, or with
``--write DIR`` only its file goes to DIR; ``--write DIR`` alone writes the three files.

Exit status: 0 on success, 1 when `explain` finds no provider or `check` finds a failure, 2 on bad usage
(including an ``INFINIOPS_*`` switch set to a value it does not accept, such as ``INFINIOPS_STRICT=maybe``).
Plugin code runs with ``sys.stdout`` sent to stderr, so that stdout carries only the command's output.

Each command is a module of this package that defines ``COMMAND``, a `Command` (its name, help, arguments and
run function), listed in `COMMANDS`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Final

from infiniops_py._env import EnvValueError
from infiniops_py._version import __version__
from infiniops_py.cli import check, explain, matrix, providers, tune
from infiniops_py.cli._command import Command
from infiniops_py.cli._console import NO_RICH, Console

__all__ = ["COMMANDS", "Command", "main"]

COMMANDS: Final[tuple[Command, ...]] = (providers.COMMAND, matrix.COMMAND, explain.COMMAND, check.COMMAND,
                                        tune.COMMAND)


# the first line of `infiniops --help`: plain text (the module doc's first line is reStructuredText)
_DESCRIPTION = "InfiniOps-Py's operators and providers: the providers, the capability matrix, why a provider " \
               "serves a problem or not, conformance checks and tuning."


def _parser() -> argparse.ArgumentParser:
    """The ``infiniops`` parser: ``--version``, and a subparser per command of `COMMANDS`, in their order."""
    parser = argparse.ArgumentParser(prog="infiniops", description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"infiniops-py {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_arguments(sub.add_parser(command.name, help=command.help))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command `argv` (default: ``sys.argv[1:]``); returns the exit status (see the module doc).

    Raises:
        SystemExit: with status 2, from argparse, on bad arguments.
    """
    args = _parser().parse_args(argv)
    command = next(c for c in COMMANDS if c.name == args.command)
    if command.prints_tables(args) and Console is None:
        print(f"infiniops {args.command}: {NO_RICH}", file=sys.stderr)
        return 2
    try:
        status = command.run(args)
        sys.stdout.flush()  # here, so that a reader that left (`infiniops matrix | head`) is seen below
        return status
    except EnvValueError as err:  # an INFINIOPS_* switch holds a value no parser accepts: usage, not a crash
        print(f"infiniops {args.command}: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of stdout left early: not a failure of the command
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 0

"""What one subcommand of ``infiniops`` is (`Command`), and the argparse types the commands share."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Command", "positive"]


def _never(args: argparse.Namespace) -> bool:
    """`Command.prints_tables` of a command that prints no rich table."""
    return False


@dataclass(frozen=True)
class Command:
    """One subcommand of ``infiniops``, as `infiniops_py.cli.main` registers and runs it.

    Attributes:
        name: the word on the command line (``infiniops NAME ...``).
        help: its one-line description in ``infiniops --help``.
        add_arguments: adds its arguments to the subparser `main` made for it.
        run: runs it on the parsed arguments; returns the exit status (0 success, 1 the command's own
            failure, 2 bad usage). Plugin code it calls should run under ``contextlib.redirect_stdout(
            sys.stderr)`` when stdout carries the command's output.
        prints_tables: whether these parsed arguments print a rich table; `main` then refuses with status 2,
            saying what to install, where the cli extra (rich) is missing.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    prints_tables: Callable[[argparse.Namespace], bool] = _never


def positive(text: str) -> int:
    """argparse type of a count or a size: `text` as an int >= 1.

    Raises:
        argparse.ArgumentTypeError: `text` is not a whole number, or is below 1 (argparse exits with status 2).
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value

"""The rich console the commands print to, and rich's names (None without the cli extra)."""

from __future__ import annotations

import os
import sys

try:  # the cli extra: without it, the commands that print tables say what to install
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
except ImportError:
    Console = Table = escape = None  # type: ignore[assignment,misc]

__all__ = ["NO_RICH", "Console", "Table", "escape", "new_console", "stdout_console"]

NO_RICH = "needs the cli extra (rich) to print its tables: pip install 'infiniops-py[cli]'"


def _columns() -> int | None:
    """``COLUMNS`` when it is a whole number >= 1, else None."""
    text = os.environ.get("COLUMNS", "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def stdout_console(*, pipe_width: int = 200) -> Console:
    """A console of ``COLUMNS`` columns when set, else the terminal's width, else (a pipe, a log)
    `pipe_width`: lines such as load errors then stay whole."""
    width = _columns() or (None if sys.stdout.isatty() else pipe_width)
    return new_console(width)


def new_console(width: int | None) -> Console:
    """A rich console whose broken pipe (the reader of stdout left) raises `BrokenPipeError` for `main`, where
    rich's own handler would exit with status 1."""
    console = Console(width=width, highlight=False)

    def reader_left() -> None:
        raise BrokenPipeError("stdout's reader left")

    console.on_broken_pipe = reader_left  # type: ignore[method-assign]
    return console

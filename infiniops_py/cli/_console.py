"""The console the commands print to: rich's when the cli extra is installed, the width of the terminal, and
the plain-text folding that every command uses without rich (or for text that is not a table).

Folding never cuts: a line longer than the width breaks at spaces, and a word longer than a whole line breaks
inside the word, so that every character of a reason or a name is still printed (never an ellipsis).
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from collections.abc import Sequence

try:  # the cli extra: without it, the commands that print tables say what to install or print plain text
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
except ImportError:
    Console = Table = escape = None  # type: ignore[assignment,misc]

__all__ = ["NO_RICH", "Console", "Table", "escape", "fold", "new_console", "plain_table", "stdout_console",
           "terminal_width"]

NO_RICH = "needs the cli extra (rich) to print its tables: pip install 'infiniops-py[cli]'"


def _columns() -> int | None:
    """``COLUMNS`` when it is a whole number >= 1, else None."""
    text = os.environ.get("COLUMNS", "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def terminal_width(pipe_width: int | None = None) -> int | None:
    """``COLUMNS`` when set, else the width of the terminal stdout is, else (a pipe, a log) `pipe_width`
    (None: no limit)."""
    if _columns():
        return _columns()
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else pipe_width


def _hang(line: str) -> str:
    """The indent of a folded line's continuations: past the line's own indent and its bullet (``- ``,
    ``1. ``), else two more spaces."""
    body = line.lstrip(" ")
    first = body.split(" ", 1)[0]
    bullet = first == "-" or (first[:-1].isdigit() and first.endswith("."))
    return " " * (len(line) - len(body) + (len(first) + 1 if bullet else 2))


def fold(text: str, width: int | None) -> str:
    """Each line of `text` folded to `width` columns (None: as it is), its continuations indented by `_hang`,
    so that a folded reason still reads as one item; nothing is cut."""
    if width is None:
        return text
    return "\n".join(textwrap.fill(line, max(width, len(_hang(line)) + 8), subsequent_indent=_hang(line),
                                   break_long_words=True, break_on_hyphens=False) if len(line) > width else line
                     for line in text.splitlines())


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int | None) -> str:
    """`rows` under `headers` in plain text, columns two spaces apart, within `width` columns (None: as wide as
    they need): the widest column is narrowed first, its cells folded onto more lines, never cut; a column
    is never narrowed below 6 (the line then runs over)."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    while width is not None and sum(widths) + 2 * (len(widths) - 1) > width and max(widths) > 6:
        widths[widths.index(max(widths))] -= 1
    lines: list[str] = []
    for n, values in enumerate([headers, *rows]):
        cells = [textwrap.wrap(v, w, break_long_words=True, break_on_hyphens=False) or [""]
                 for v, w in zip(values, widths)]
        for k in range(max(map(len, cells))):
            lines.append("  ".join((c[k] if k < len(c) else "").ljust(w) for c, w in zip(cells, widths)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def stdout_console(*, pipe_width: int = 200) -> Console:
    """A console of ``COLUMNS`` columns when set, else the terminal's width, else (a pipe, a log)
    `pipe_width`: lines such as load errors then stay whole."""
    return new_console(_columns() or (None if sys.stdout.isatty() else pipe_width))


def new_console(width: int | None) -> Console:
    """A rich console whose broken pipe (the reader of stdout left) raises `BrokenPipeError` for `main`, where
    rich's own handler would exit with status 1."""
    console = Console(width=width, highlight=False)

    def reader_left() -> None:
        raise BrokenPipeError("stdout's reader left")

    console.on_broken_pipe = reader_left  # type: ignore[method-assign]
    return console

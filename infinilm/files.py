"""What a path in a checkpoint directory is, found by one ``stat`` (symlinks followed), never by opening it.

A FIFO would block an ``open``, a device can be read forever and a directory is no file: the loader and the
tokenizer refuse each with its name before they read anything.
"""

from __future__ import annotations

import errno
import stat
from pathlib import Path

__all__ = ["file_kind"]

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def file_kind(file: Path) -> str | None:
    """None for a regular file (symlinks followed); else ``"missing"`` (a dangling symlink too) or what `file` is
    (``"a directory"``, ``"a FIFO (named pipe)"``, ``"a symlink loop"``, ...). Only stats `file`, never opens it."""
    try:
        mode = file.stat().st_mode
    except OSError as err:
        return "a symlink loop" if err.errno == errno.ELOOP else "missing"
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")

"""Environment switches, parsed one way everywhere: booleans (``INFINIOPS_STRICT``, ``INFINIOPS_TRACE_CALLS``,
...) and comma-separated lists of names (``INFINIOPS_PROVIDERS``).

A leaf module: it imports nothing from the project, so every layer may use it.
"""

from __future__ import annotations

import os
from typing import Final

__all__ = ["FALSE_WORDS", "TRUE_WORDS", "EnvValueError", "env_flag", "env_names", "parse_flag", "split_names"]

TRUE_WORDS: Final = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS: Final = frozenset({"0", "false", "no", "off"})


class EnvValueError(ValueError):
    """An environment variable holds a value its parser does not accept; the message names the variable."""


def parse_flag(name: str, raw: str | None, default: bool) -> bool:
    """`raw`, the value of environment variable `name`, as a bool; unset or empty gives `default`.

    Case and surrounding blanks are ignored: ``1``, ``true``, ``yes``, ``on`` are true; ``0``, ``false``,
    ``no``, ``off`` are false.

    Raises:
        EnvValueError: (a ValueError) any other value, naming the variable and the words it accepts.
    """
    if raw is None:
        return default
    word = raw.strip().lower()
    if not word:
        return default
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    on, off = ", ".join(sorted(TRUE_WORDS)), ", ".join(sorted(FALSE_WORDS))
    raise EnvValueError(f"environment variable {name}={raw!r} is not a boolean: use one of {on} (on) "
                     f"or {off} (off), or leave it unset")


def env_flag(name: str, default: bool = False) -> bool:
    """The boolean environment variable `name` (see `parse_flag`); `default` when unset or empty.

    Raises:
        EnvValueError: (a ValueError) a value that is neither true nor false, naming the variable.
    """
    return parse_flag(name, os.environ.get(name), default)


def split_names(text: str) -> tuple[str, ...]:
    """``"a, b,,c"`` as ``("a", "b", "c")``: the comma-separated names, stripped, empty ones dropped."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def env_names(name: str) -> tuple[str, ...]:
    """The environment variable `name` as a comma-separated list of names (`split_names`); unset gives ()."""
    return split_names(os.environ.get(name, ""))

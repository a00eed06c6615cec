"""What one subcommand of ``infiniops`` is (`Command`), and the argparse types the commands share."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Command", "device", "dtype", "field_value", "pairs", "positive"]


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


def device(text: str, flag: str = "--device") -> str:
    """`text` of `flag` as a device: ``cpu``, ``cuda`` or ``cuda:N`` (N a whole number), as given.

    Raises:
        ValueError: another device, naming the known ones (the commands exit with status 2).
    """
    from infiniops_py.matrix import DEVICES

    kind, colon, index = text.partition(":")
    if kind in DEVICES and (not colon or (kind == "cuda" and index.isdigit())):
        return text
    raise ValueError(f"{flag} {text}: unknown device {text!r}; known: {', '.join(DEVICES)} (and cuda:N)")


def dtype(text: str, flag: str = "--dtype") -> str:
    """`text` of `flag` as the canonical name of a dtype the framework knows (``float32``, ``bf16``,
    ``torch.float16``; `problem.dtype_name`).

    Raises:
        ValueError: another name, naming the known ones (the commands exit with status 2).
    """
    from infiniops_py.problem import DTYPE_NAMES, dtype_name

    name = dtype_name(text)
    if name in DTYPE_NAMES.values():
        return name
    known = ", ".join(DTYPE_NAMES.values())
    raise ValueError(f"{flag} {text}: unknown dtype {text!r}; known: {known} (or bf16, fp16, fp32, fp64)")


def field_value(text: str, default: Any) -> Any:
    """`text` of ``--field K=V`` as the type of the field's `default`: a bool (true/false/1/0), an int, a float,
    else the str; with no default, the first of bool, int, float, str that parses.

    Raises:
        ValueError: `text` does not parse as the default's type.
    """
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


def pairs(items: list[str], flag: str, parse: Callable[[str, str], Any]) -> dict[str, Any]:
    """``K=V`` items of a repeatable `flag` as a dict, each value ``parse(K, V)``.

    Raises:
        ValueError: an item without ``=`` or a name, or a value `parse` refuses, naming `flag` and the item.
    """
    out: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise ValueError(f"{flag} {item!r}: expected K=V")
        try:
            out[name] = parse(name, text)
        except ValueError as err:
            raise ValueError(f"{flag} {item!r}: {err}") from None
    return out

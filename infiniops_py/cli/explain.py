"""``infiniops explain``: rank the providers for one operator problem and say why each serves it or not."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from infiniops_py.cli._command import Command, positive

__all__ = ["COMMAND"]

_SHORTCUTS = (("head_dim", "--head-dim"), ("block_size", "--block-size"), ("width", "--width"))


def _arguments(parser: argparse.ArgumentParser) -> None:
    """``OP``, ``--device``, ``--dtype``, the shortcuts of `_SHORTCUTS`, ``--field K=V``."""
    parser.add_argument("op")
    parser.add_argument("--device", default="cpu", help="device type (default: cpu)")
    parser.add_argument("--dtype", default="float32", help="dtype (default: float32)")
    for field, flag in _SHORTCUTS:
        parser.add_argument(flag, dest=field, type=positive, default=None, help=f"problem field {field} (>= 1)")
    parser.add_argument("--field", action="append", default=[], metavar="K=V", help="any other problem field")


def _value(text: str, default: Any) -> Any:
    """`text` of ``--field K=V`` as the type of the field's `default`: a bool (true/false/1/0), an int, a float,
    else the str; with no default, the first of bool, int, float, str that parses."""
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


def _run(args: argparse.Namespace) -> int:
    """Print the ranking of the problem's providers; returns 0 when one serves it, 1 when none does, 2 on bad
    usage."""
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


COMMAND = Command("explain", "rank the providers for one problem and say why", _arguments, _run)

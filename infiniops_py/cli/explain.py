"""``infiniops explain``: rank the providers for one operator problem and say why each serves it or not.

The ranking folds to the terminal's width (``COLUMNS``, else the terminal's; on a pipe its lines stay whole);
a provider that cannot run on this machine at all (a GPU provider without a GPU, a missing package) is one
line with the reason.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from infiniops_py.cli._command import Command, device, dtype, field_value, pairs, positive
from infiniops_py.cli._console import fold, terminal_width
from infiniops_py.cli._machine import cannot_run

__all__ = ["COMMAND"]

# (problem field, flags): the first flag is the name shown in the help, the others are aliases
_SHORTCUTS = (("head_dim", ("--head-dim",)), ("block_size", ("--block-size",)),
              ("width", ("--conv-width", "--width")))
_HELP = {"head_dim": "the attention's or norm's head dim", "block_size": "the paged KV cache's block size "
         "(implies paged=true)", "width": "the causal conv's kernel width (--width is an older name)"}


def _arguments(parser: argparse.ArgumentParser) -> None:
    """``OP``, ``--device``, ``--dtype``, the shortcuts of `_SHORTCUTS`, ``--field K=V``."""
    parser.add_argument("op", help="the operator (infiniops matrix lists them)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16, float16, ... (default: float32)")
    for field, flags in _SHORTCUTS:
        parser.add_argument(*flags, dest=field, type=positive, default=None, metavar="N",
                            help=f"problem field {field}: {_HELP[field]}")
    parser.add_argument("--field", action="append", default=[], metavar="K=V", help="any other problem field")


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
        device_type = device(args.device).partition(":")[0]  # a problem names the device type: cuda:1 is cuda
        fields.update(pairs(args.field, "--field", lambda name, text: field_value(text, spec.fields.get(name))))
        if fields.get("block_size") and "paged" in spec.fields:
            fields.setdefault("paged", True)  # a block size means a paged cache, unless --field paged= says
        problem = runtime.make_problem(args.op, device_type=device_type, dtype=dtype(args.dtype), **fields)
    except (TypeError, ValueError) as err:
        print(f"infiniops explain: {err}", file=sys.stderr)
        return 2
    ex = runtime.explain(problem)
    width = terminal_width()
    # with the most likely fix when nothing serves the problem
    print(fold(ex.render(lambda c: cannot_run(c.rejections, problem.device_type)), width))
    if ex.chosen is not None:
        print(fold(f"  -> {ex.chosen.provider} serves it ({ex.chosen.name})", width))
        return 0
    return 1


COMMAND = Command("explain", "rank the providers for one problem and say why", _arguments, _run)

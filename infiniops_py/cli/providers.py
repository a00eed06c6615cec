"""``infiniops providers``: each provider's version, source, implementations, and whether it loaded and can run.

The table fits the terminal (``COLUMNS``, else the terminal's width; 200 columns on a pipe): long cells fold
onto more lines, never cut. Without the cli extra (rich) it is plain text. ``--format json`` prints the same
facts as JSON. Each load error follows the table on a line of its own, whole (errors get copied into bug
reports).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from infiniops_py.cli._command import Command
from infiniops_py.cli._console import Table, escape, plain_table, stdout_console, terminal_width
from infiniops_py.cli._machine import cannot_run

__all__ = ["COMMAND"]

_COLUMNS = ("provider", "version", "source", "implementations", "status")


def _arguments(parser: argparse.ArgumentParser) -> None:
    """``--format table|json``."""
    parser.add_argument("--format", choices=("table", "json"), default="table",
                        help="table (the default; plain text without the cli extra) or json")


def _run(args: argparse.Namespace) -> int:
    """Print the providers' table (or JSON), then each load error on a line of its own; returns 0."""
    from infiniops_py import runtime

    found = sorted(runtime.providers(), key=lambda p: (p.name == "reference", p.name))
    facts = [{"name": p.name, "version": p.version, "source": p.source, "implementations": len(p.implementations),
              "loaded": not p.error, "cannot_run": "" if p.error else _cannot_run(p), "error": p.error or ""}
             for p in found]
    if args.format == "json":
        json.dump({"providers": facts}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    if Table is None:
        rows = [[f["name"], f["version"], f["source"], str(f["implementations"]), _status(f)] for f in facts]
        print(plain_table(_COLUMNS, rows, terminal_width(200)))
        for f in facts:
            if f["error"]:
                print(f"{f['name']} failed to load: {f['error']}")
        return 0
    table = Table(title="InfiniOps-Py providers")
    for column in _COLUMNS:
        table.add_column(column, overflow="fold")  # a long source or reason folds, never ends in an ellipsis
    for f in facts:
        status = _status(f)
        style = "red" if f["error"] else "yellow" if f["cannot_run"] else "green"
        table.add_row(escape(f["name"]), escape(f["version"]), escape(f["source"]), str(f["implementations"]),
                      f"[{style}]{escape(status)}[/{style}]")
    console = stdout_console()
    console.print(table)
    for f in facts:
        if f["error"]:  # one unwrapped line each: errors are long and get copied into bug reports
            console.print(f"[red]{escape(f['name'])} failed to load:[/red] {escape(f['error'])}", soft_wrap=True)
    return 0


def _status(facts: dict[str, Any]) -> str:
    """``failed to load (below)``, ``loaded; cannot run: <why>`` or ``loaded``."""
    if facts["error"]:
        return "failed to load (below)"
    return f"loaded; cannot run: {facts['cannot_run']}" if facts["cannot_run"] else "loaded"


def _cannot_run(p: Any) -> str:
    """Why no implementation of a loaded provider can run on this machine (`_machine.cannot_run`: a missing
    import, no CUDA device for a provider that needs one), or ''. A plugin's import check that raises is
    listed as such (`capability.safe_reject`): its implementation cannot run."""
    from infiniops_py.capability import CudaAvailable, Requires, safe_reject
    from infiniops_py.operators import OPERATORS

    reasons: dict[str, None] = {}
    for impl in p.implementations:
        spec = OPERATORS.get(impl.op)
        if spec is None:
            return ""
        problem = spec.problem()
        env = [r for c in impl.capability.constraints if isinstance(c, (Requires, CudaAvailable))
               for r in [safe_reject(c, problem)] if r is not None]
        faulty = [str(r) for r in env if r.constraint not in ("requires", "cuda")]
        text = "; ".join(filter(None, [cannot_run(env, problem.device_type), *faulty]))
        if not text:
            return ""
        reasons[text] = None
    return "; ".join(reasons)


COMMAND = Command("providers", "list the providers: version, source, loaded or the load error", _arguments, _run)

"""``infiniops providers``: each provider's version, source, implementations, and whether it loaded."""

from __future__ import annotations

import argparse
from typing import Any

from infiniops_py.cli._command import Command
from infiniops_py.cli._console import Table, escape, stdout_console

__all__ = ["COMMAND"]


def _run(args: argparse.Namespace) -> int:
    """Print the providers' table, then each load error on a line of its own; returns 0."""
    from infiniops_py import runtime

    table = Table(title="InfiniOps-Py providers")
    for column in ("provider", "version", "source", "implementations", "status"):
        table.add_column(column)
    found = sorted(runtime.providers(), key=lambda p: (p.name == "reference", p.name))
    for p in found:
        missing = _missing_imports(p)
        status = ("[red]failed to load (below)[/red]" if p.error else
                  f"[yellow]loaded; cannot run: {escape(missing)}[/yellow]" if missing else "[green]loaded[/green]")
        table.add_row(escape(p.name), escape(p.version), escape(p.source), str(len(p.implementations)), status)
    console = stdout_console()
    console.print(table)
    for p in found:
        if p.error:  # one unwrapped line each: errors are long and get copied into bug reports
            console.print(f"[red]{escape(p.name)} failed to load:[/red] {escape(p.error)}", soft_wrap=True)
    return 0


def _missing_imports(p: Any) -> str:
    """What every implementation of a loaded provider needs and cannot import (``cupy is not importable (fix:
    pip install ...)``), or '' (a provider whose package, such as CuPy, is simply not installed here). A plugin's
    import check that raises is listed as such (`capability.safe_reject`): its implementation cannot run."""
    from infiniops_py.capability import Requires, safe_reject
    from infiniops_py.operators import OPERATORS

    common: dict[str, str] | None = None
    for impl in p.implementations:
        spec = OPERATORS.get(impl.op)
        problem = spec.problem() if spec is not None else None
        found = {}
        for c in impl.capability.constraints:
            rejection = safe_reject(c, problem) if isinstance(c, Requires) and problem is not None else None
            if rejection is not None and rejection.constraint == "requires":
                found[str(rejection.found)] = f"{rejection.found} is not importable (fix: {rejection.fix})"
            elif rejection is not None:  # the plugin's check raised, or returned something else
                found[str(rejection)] = str(rejection)
        common = found if common is None else {k: v for k, v in common.items() if k in found}
    return "; ".join((common or {}).values())


def _arguments(parser: argparse.ArgumentParser) -> None:
    """``providers`` takes no arguments."""


COMMAND = Command("providers", "list the providers: version, source, loaded or the load error", _arguments, _run,
                  prints_tables=lambda args: True)

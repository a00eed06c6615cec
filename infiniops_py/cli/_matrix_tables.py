"""The capability matrix on the terminal: compact (fits the console) or wide (every cell and its reasons)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infiniops_py.cli._console import Table, escape, new_console, stdout_console

if TYPE_CHECKING:  # the matrix imports the runtime: only `infiniops matrix` needs it, when it runs
    from infiniops_py.matrix import Matrix, Row

__all__ = ["print_tables"]

_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}


def _compact_limits(row: Row) -> list[str]:
    """A row's limits without the provider's name: the constraints alone for one implementation, else each
    implementation's name less the ``provider.`` prefix, then its constraints; '-' for none."""
    parts = [text.partition(": ") for text in row.limits]
    if len(parts) == 1:
        return [parts[0][2].replace("no other limits", "-")]
    return [f"{name.removeprefix(row.provider + '.')}: {text}" for name, _, text in parts]


def print_tables(m: Matrix, *, wide: bool, every_row: bool) -> None:
    """The matrix on the terminal: compact (one table, a row per operator and provider, the dtypes served per
    device; fits the console) or `wide` (a table per operator, a column per cell with the gate reasons, no
    width limit). Rows serving nothing on the devices shown are left out unless `every_row`."""
    from rich import box

    console = new_console(100_000) if wide else stdout_console(pipe_width=80)
    shown = [r for r in m.rows if every_row or any(c.served for c in r.cells)]
    hidden = list(dict.fromkeys(r.provider for r in m.rows if r not in shown))
    if wide:
        for op, doc in m.operators:
            table = Table(title=escape(f"{op}: {doc}" if doc else op), title_justify="left")
            table.add_column("provider")
            for dev in m.devices:
                for dt in m.dtypes:
                    table.add_column(f"{dev}\n{dt}")
            table.add_column("compute\ncapability")
            table.add_column("limits")
            for r in (r for r in shown if r.op == op):
                cells = ["[green]served[/green]" if c.served else f"[red]gated[/red]: {escape('; '.join(c.reasons))}"
                         for c in r.cells]
                table.add_row(escape(r.provider), *cells, r.compute_capability_text(),
                              escape("\n".join(r.limits) or "-"))
            console.print(table)
    else:  # a table per operator, its name as the title; the same column widths in every table
        served = {(r, dev): " ".join(_SHORT.get(c.dtype, c.dtype) for c in r.cells if c.device == dev and c.served)
                  or "-" for r in shown for dev in m.devices}
        widths = [max([len("provider"), *(len(r.provider) for r in shown)]),
                  *(max([len(dev), *(len(served[r, dev]) for r in shown)]) for dev in m.devices)]
        names = ", ".join(f"{short} = {dt}" for dt, short in _SHORT.items() if dt in m.dtypes)
        console.print(f"Each device column lists the dtypes served ({names}; - none). --wide: every cell and why "
                      "it is gated; infiniops explain OP --device D --dtype T: one problem.")
        first = True
        for op, _ in m.operators:
            rows = [r for r in shown if r.op == op]
            if not rows:
                continue
            table = Table(title=f"[bold]{escape(op)}[/bold]", title_justify="left", box=box.SIMPLE_HEAD,
                          pad_edge=False, show_edge=False, show_header=first, expand=True)
            for name, width in zip(("provider", *m.devices), widths):
                table.add_column(name, width=width, no_wrap=True)
            table.add_column("limits", ratio=1, overflow="fold")  # a long name folds, never ends in an ellipsis
            for r in rows:
                limits = [*_compact_limits(r), *(f"compute capability >= {cc}" for cc in r.compute_capability)]
                table.add_row(escape(r.provider), *(served[r, dev] for dev in m.devices), escape("\n".join(limits)))
            console.print(table)
            first = False
    if hidden:
        console.print(f"Not shown: rows of {', '.join(hidden)} that serve nothing on {', '.join(m.devices)} "
                      "(--all-providers shows them).")
    for p in m.providers:
        if p.error:
            console.print(f"[red]provider {escape(p.name)} failed to load[/red]: {escape(p.error)}", soft_wrap=wide)

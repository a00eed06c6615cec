"""The capability matrix: operators x providers x devices x dtypes, as data, JSON, Markdown and HTML.

A cell is *served* when some implementation of the provider declares the device and the dtype (its other
limits, such as head dims or widths, are listed beside it), else *gated* with the reasons. Only static
constraints are evaluated: environment constraints (a needed import, a CUDA device, a compute capability)
are shown as requirements, so the output is the same on any machine with the same providers installed.
Everything is sorted and carries no timestamp; `write` produces ``matrix.json``, ``MATRIX.md`` and a
self-contained ``index.html``.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from infiniops_py import runtime
from infiniops_py.capability import CudaAvailable, constraint_text, safe_reject
from infiniops_py.operators import OPERATORS
from infiniops_py.registry import Implementation, Provider

__all__ = ["DEVICES", "DTYPES", "Cell", "Matrix", "Row", "build", "to_html", "to_json", "to_markdown", "write"]

DEVICES: Final = ("cpu", "cuda")
DTYPES: Final = ("float16", "bfloat16", "float32")
_KEYS: Final = ("device_type", "dtype")
_WHERE: Final = re.compile(r" \(at [^()]*:\d+\)$")  # a traceback location: machine-specific


@dataclass(frozen=True)
class Cell:
    """One (device, dtype) of one provider's row: served by `implementations`, or gated for `reasons`."""

    device: str
    dtype: str
    served: bool
    implementations: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()

    def text(self) -> str:
        return "served" if self.served else "gated: " + "; ".join(self.reasons)


@dataclass(frozen=True)
class Row:
    """One provider for one operator: its cells, and each implementation's other limits."""

    op: str
    provider: str
    cells: tuple[Cell, ...]
    limits: tuple[str, ...]

    def limits_text(self) -> str:
        return "; ".join(self.limits) or "-"


@dataclass(frozen=True)
class ProviderInfo:
    name: str
    version: str
    source: str
    error: str


@dataclass(frozen=True)
class Matrix:
    devices: tuple[str, ...]
    dtypes: tuple[str, ...]
    providers: tuple[ProviderInfo, ...]
    operators: tuple[tuple[str, str], ...]  # (name, doc)
    rows: tuple[Row, ...]

    def rows_of(self, op: str) -> list[Row]:
        return [r for r in self.rows if r.op == op]


def _provider_order(p: Provider) -> tuple[bool, str]:
    return (p.name == "reference", p.name)  # the last resort last


def _static_rejections(impl: Implementation, device: str, dtype: str) -> list[str]:
    problem = OPERATORS[impl.op].problem(device, dtype)
    found = []
    for c in impl.capability.constraints:
        if c.environmental or c.field not in _KEYS:
            continue
        r = safe_reject(c, problem)
        if r is not None:
            found.append(f"{r.field}={r.found} {r.allowed}")
    return found


def _limits(impl: Implementation) -> str:
    parts = [constraint_text(c) for c in impl.capability.constraints if not c.environmental and c.field not in _KEYS]
    # every cuda cell needs a CUDA device (the intro says so): listing it on each row is noise
    parts += [constraint_text(c) for c in impl.capability.constraints
              if c.environmental and not isinstance(c, CudaAvailable)]
    return f"{impl.name}: " + (", ".join(parts) if parts else "no other limits")


def _cell(impls: Sequence[Implementation], device: str, dtype: str) -> Cell:
    if not impls:
        return Cell(device, dtype, False, reasons=("no implementation",))
    serving, reasons = [], []
    for impl in impls:
        rejected = _static_rejections(impl, device, dtype)
        if rejected:
            reasons.extend(r for r in rejected if r not in reasons)
        else:
            serving.append(impl.name)
    if serving:
        return Cell(device, dtype, True, implementations=tuple(sorted(serving)))
    return Cell(device, dtype, False, reasons=tuple(reasons))


def build(*, ops: Sequence[str] | None = None, devices: Sequence[str] = DEVICES,
          dtypes: Sequence[str] = DTYPES) -> Matrix:
    """The matrix of the providers the runtime knows (``INFINIOPS_PROVIDERS`` applies).

    Raises:
        KeyError: an unknown operator in `ops`.
    """
    for op in ops or ():
        if op not in OPERATORS:
            raise KeyError(f"unknown operator {op!r}; known: {', '.join(OPERATORS)}")
    providers = sorted(runtime.providers(), key=_provider_order)
    infos = tuple(ProviderInfo(p.name, p.version, p.source, _WHERE.sub("", p.error)) for p in providers)
    names = [op for op in OPERATORS if ops is None or op in ops]
    rows = []
    for op in names:
        for p in providers:
            if not p.loaded:
                continue
            impls = sorted((i for i in p.implementations if i.op == op), key=lambda i: i.name)
            cells = tuple(_cell(impls, dev, dt) for dev in devices for dt in dtypes)
            rows.append(Row(op, p.name, cells, tuple(_limits(i) for i in impls)))
    return Matrix(tuple(devices), tuple(dtypes), infos, tuple((op, OPERATORS[op].doc) for op in names), tuple(rows))


# --- renderings -----------------------------------------------------------------------------------------

def to_json(m: Matrix) -> str:
    """Sorted, indented JSON with a trailing newline."""
    data: dict[str, Any] = {
        "devices": list(m.devices),
        "dtypes": list(m.dtypes),
        "providers": [asdict(p) for p in m.providers],
        "operators": [
            {"name": op, "doc": doc, "providers": [
                {"provider": r.provider, "limits": list(r.limits),
                 "cells": [{**asdict(c), "implementations": list(c.implementations), "reasons": list(c.reasons)}
                           for c in r.cells]}
                for r in m.rows_of(op)]}
            for op, doc in m.operators
        ],
    }
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _status(p: ProviderInfo) -> str:
    return f"failed to load: {p.error}" if p.error else "loaded"


_INTRO: Final = (
    "A cell is **served** when an implementation of the provider declares the device and dtype (its other "
    "limits are in the last column), else **gated** with the reason. Environment requirements (an import, a "
    "compute capability) are listed, not evaluated; every cuda cell also needs a CUDA device."
)


def to_markdown(m: Matrix) -> str:
    columns = [f"{dev} {dt}" for dev in m.devices for dt in m.dtypes]
    lines = ["# Capability matrix", "",
             "Generated by `infiniops matrix --write capability_matrix`; do not edit by hand.", "", _INTRO, "",
             "## Providers", "", "| provider | version | source | status |", "|---|---|---|---|"]
    lines += [f"| {p.name} | {p.version} | {_md(p.source)} | {_md(_status(p))} |" for p in m.providers]
    for op, doc in m.operators:
        lines += ["", f"## {op}", ""]
        if doc:
            lines += [_md(doc), ""]
        lines += ["| provider | " + " | ".join(columns) + " | limits |", "|---" * (len(columns) + 2) + "|"]
        for r in m.rows_of(op):
            cells = " | ".join(_md(c.text()) for c in r.cells)
            lines.append(f"| {r.provider} | {cells} | {_md(r.limits_text())} |")
    return "\n".join(lines) + "\n"


_CSS: Final = (
    "body{font-family:system-ui,sans-serif;margin:2em;color:#222}"
    "table{border-collapse:collapse;margin-bottom:1.5em}"
    "th,td{border:1px solid #ccc;padding:4px 8px;vertical-align:top;font-size:14px}"
    "th{background:#f3f3f3}td.served{background:#e3f6e3}td.gated{background:#fbe4e4;font-size:12px}"
    "td.limits{font-size:12px;max-width:32em}td.failed{color:#a00}"
)


def to_html(m: Matrix) -> str:
    """A self-contained static page (inline CSS, no scripts)."""
    e = html.escape
    columns = "".join(f"<th>{e(dev)}<br>{e(dt)}</th>" for dev in m.devices for dt in m.dtypes)
    out = ['<!DOCTYPE html>', '<html lang="en"><head><meta charset="utf-8">',
           "<title>InfiniOps-Py capability matrix</title>", f"<style>{_CSS}</style></head><body>",
           "<h1>Capability matrix</h1>",
           "<p>Generated by <code>infiniops matrix --write capability_matrix</code>. "
           f"{e(_INTRO).replace('**', '')}</p>",
           "<h2>Providers</h2>", "<table><tr><th>provider</th><th>version</th><th>source</th><th>status</th></tr>"]
    for p in m.providers:
        status = f'<td class="failed">{e(_status(p))}</td>' if p.error else "<td>loaded</td>"
        out.append(f"<tr><td>{e(p.name)}</td><td>{e(p.version)}</td><td>{e(p.source)}</td>{status}</tr>")
    out.append("</table>")
    for op, doc in m.operators:
        out += [f'<h2 id="{e(op)}">{e(op)}</h2>', f"<p>{e(doc)}</p>" if doc else "",
                f"<table><tr><th>provider</th>{columns}<th>limits</th></tr>"]
        for r in m.rows_of(op):
            cells = "".join(
                '<td class="served">served</td>' if c.served
                else f'<td class="gated">gated: {e("; ".join(c.reasons))}</td>'
                for c in r.cells
            )
            limits = "<br>".join(e(x) for x in r.limits) or "-"
            out.append(f'<tr><td>{e(r.provider)}</td>{cells}<td class="limits">{limits}</td></tr>')
        out.append("</table>")
    out.append("</body></html>")
    return "\n".join(x for x in out if x) + "\n"


def write(m: Matrix, directory: str | Path) -> list[Path]:
    """Write ``matrix.json``, ``MATRIX.md`` and ``index.html`` into `directory` (created if needed)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    files = {"matrix.json": to_json(m), "MATRIX.md": to_markdown(m), "index.html": to_html(m)}
    for name, text in files.items():
        (root / name).write_text(text, encoding="utf-8")
    return [root / name for name in files]

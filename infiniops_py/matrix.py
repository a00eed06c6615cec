"""The capability matrix: operators x providers x devices x dtypes, as data, JSON, Markdown and HTML.

A cell is *served* when some implementation of the provider declares the device and the dtype (its other
limits, such as head dims or widths, are listed beside it), else *gated* with the reasons. Only static
constraints are evaluated: environment constraints (a needed import, a CUDA device, a compute capability)
are shown as requirements, so the output is the same on any machine with the same providers installed;
the minimum compute capability also has a column of its own. Rows are (operator, provider) pairs for the
providers that implement the operator (``unimplemented=True`` adds the others). Everything is sorted and
carries no timestamp; `write` produces ``matrix.json``, ``MATRIX.md`` and ``index.html`` (a single
self-contained page: filters by operator, provider, device and dtype, search, sortable columns, an anchor
per row and per cell, a legend; no network).
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
from infiniops_py.capability import ComputeCapability, CudaAvailable, constraint_text, safe_reject
from infiniops_py.operators import OPERATORS
from infiniops_py.registry import Implementation, Provider

__all__ = ["DEVICES", "DTYPES", "FILES", "Cell", "Matrix", "ProviderInfo", "Row", "build", "to_html", "to_json",
           "to_markdown", "write"]

DEVICES: Final = ("cpu", "cuda")
DTYPES: Final = ("float16", "bfloat16", "float32", "float64")
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
    """One provider for one operator: its cells, each implementation's other limits, and the minimum CUDA
    compute capability its implementations need (``"8.0"``; empty when none states one)."""

    op: str
    provider: str
    cells: tuple[Cell, ...]
    limits: tuple[str, ...]
    compute_capability: tuple[str, ...] = ()

    def limits_text(self) -> str:
        return "; ".join(self.limits) or "-"

    def compute_capability_text(self) -> str:
        return ", ".join(f">= {cc}" for cc in self.compute_capability) or "-"

    @property
    def implemented(self) -> bool:
        return bool(self.limits)


@dataclass(frozen=True)
class ProviderInfo:
    """A provider as the matrix lists it: name, version, where it came from, and its load error ('' if loaded)."""

    name: str
    version: str
    source: str
    error: str


@dataclass(frozen=True)
class Matrix:
    """The devices and dtypes of the columns, the providers, the operators (name, doc) and the rows."""

    devices: tuple[str, ...]
    dtypes: tuple[str, ...]
    providers: tuple[ProviderInfo, ...]
    operators: tuple[tuple[str, str], ...]  # (name, doc)
    rows: tuple[Row, ...]

    def rows_of(self, op: str) -> list[Row]:
        """The rows of operator `op`, in provider order (the last-resort ``reference`` last)."""
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
    # every cuda cell needs a CUDA device (the intro says so): listing it on each row is noise; the compute
    # capability has its own column
    parts += [constraint_text(c) for c in impl.capability.constraints
              if c.environmental and not isinstance(c, CudaAvailable | ComputeCapability)]
    return f"{impl.name}: " + (", ".join(parts) if parts else "no other limits")


def _compute_capability(impls: Sequence[Implementation]) -> tuple[str, ...]:
    found = {c.minimum for i in impls for c in i.capability.constraints if isinstance(c, ComputeCapability)}
    return tuple(f"{major}.{minor}" for major, minor in sorted(found))


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
          dtypes: Sequence[str] = DTYPES, unimplemented: bool = False) -> Matrix:
    """The matrix of the providers the runtime knows (``INFINIOPS_PROVIDERS`` applies).

    Args:
        ops: the operators (default: all, in `OPERATORS` order).
        devices, dtypes: the columns.
        unimplemented: also a row, all cells gated ("no implementation"), for each loaded provider that
            does not implement an operator.

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
            if not impls and not unimplemented:
                continue
            cells = tuple(_cell(impls, dev, dt) for dev in devices for dt in dtypes)
            rows.append(Row(op, p.name, cells, tuple(_limits(i) for i in impls), _compute_capability(impls)))
    return Matrix(tuple(devices), tuple(dtypes), infos, tuple((op, OPERATORS[op].doc) for op in names), tuple(rows))


# --- renderings -----------------------------------------------------------------------------------------

_GENERATED: Final = "Generated by `infiniops matrix` from the providers listed below; regenerate it, do not edit it."
_INTRO: Final = (
    "A cell is **served** when an implementation of the provider declares the device and dtype (its other "
    "limits are in the last column), else **gated** with the reason. Environment requirements (an import, a "
    "compute capability) are listed, not evaluated; every cuda cell also needs a CUDA device."
)


def to_json(m: Matrix) -> str:
    """Sorted, indented JSON with a trailing newline: devices, dtypes, providers, and per operator its rows
    (provider, limits, compute_capability, cells)."""
    data: dict[str, Any] = {
        "devices": list(m.devices),
        "dtypes": list(m.dtypes),
        "providers": [asdict(p) for p in m.providers],
        "operators": [
            {"name": op, "doc": doc, "providers": [
                {"provider": r.provider, "limits": list(r.limits), "compute_capability": list(r.compute_capability),
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


def to_markdown(m: Matrix) -> str:
    """The matrix as Markdown: the providers, then a table per operator (cells, compute capability, limits)."""
    columns = [f"{dev} {dt}" for dev in m.devices for dt in m.dtypes]
    lines = ["# Capability matrix", "", _GENERATED, "", _INTRO, "",
             "## Providers", "", "| provider | version | source | status |", "|---|---|---|---|"]
    lines += [f"| {p.name} | {p.version} | {_md(p.source)} | {_md(_status(p))} |" for p in m.providers]
    for op, doc in m.operators:
        lines += ["", f"## {op}", ""]
        if doc:
            lines += [_md(doc), ""]
        lines += ["| provider | " + " | ".join(columns) + " | compute capability | limits |",
                  "|---" * (len(columns) + 3) + "|"]
        for r in m.rows_of(op):
            cells = " | ".join(_md(c.text()) for c in r.cells)
            lines.append(f"| {r.provider} | {cells} | {r.compute_capability_text()} | {_md(r.limits_text())} |")
    return "\n".join(lines) + "\n"


_CSS: Final = """\
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin-bottom:1.5em}
th,td{border:1px solid #ccc;padding:3px 6px;vertical-align:top;font-size:13px}
th{background:#f3f3f3;position:sticky;top:0}
th.sortable{cursor:pointer}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
td.served{background:#e3f6e3}td.gated{background:#fbe4e4;font-size:11px;max-width:14em}
td.limits{font-size:11px;max-width:30em}td.failed{color:#a00}
td a{color:inherit;text-decoration:none}:target{outline:3px solid #e0a000}
#filters{display:flex;flex-wrap:wrap;gap:.8em;align-items:center;margin:1em 0;padding:.6em;background:#f7f7f7}
#legend span{display:inline-block;padding:1px 6px;margin-right:.4em;border:1px solid #ccc}
.served-key{background:#e3f6e3}.gated-key{background:#fbe4e4}
[hidden]{display:none !important}
"""

# Filters come from the controls and from the page's query string (index.html?op=rms_norm&device=cuda&dtype=
# float16&provider=torch&q=text&served=1), which the controls keep up to date; anchors (#op.provider and
# #op.provider.device.dtype) name rows and cells. Clicking a header sorts by that column.
_SCRIPT: Final = """\
(function () {
  "use strict";
  var $ = function (id) { return document.getElementById(id); };
  var table = $("matrix"), body = table.tBodies[0];
  var rows = Array.prototype.slice.call(body.rows);
  var controls = {op: $("f-op"), provider: $("f-provider"), device: $("f-device"), dtype: $("f-dtype"),
                  q: $("f-q"), served: $("f-served")};
  var params = new URLSearchParams(window.location.search);
  Object.keys(controls).forEach(function (key) {
    var c = controls[key], v = params.get(key);
    if (v === null) return;
    if (c.type === "checkbox") c.checked = v === "1"; else c.value = v;
  });
  function shownCell(c) {
    return (!controls.device.value || c.dataset.device === controls.device.value) &&
           (!controls.dtype.value || c.dataset.dtype === controls.dtype.value);
  }
  function apply() {
    table.querySelectorAll("[data-device]").forEach(function (c) { c.hidden = !shownCell(c); });
    var q = controls.q.value.trim().toLowerCase(), shown = 0;
    rows.forEach(function (r) {
      var ok = (!controls.op.value || r.dataset.op === controls.op.value) &&
               (!controls.provider.value || r.dataset.provider === controls.provider.value) &&
               (!q || r.textContent.toLowerCase().indexOf(q) >= 0);
      if (ok && controls.served.checked) {
        ok = Array.prototype.some.call(r.querySelectorAll("td.served"), shownCell);
      }
      r.hidden = !ok;
      if (ok) shown += 1;
    });
    $("count").textContent = shown + " of " + rows.length + " rows";
    var out = new URLSearchParams();
    Object.keys(controls).forEach(function (key) {
      var c = controls[key], v = c.type === "checkbox" ? (c.checked ? "1" : "") : c.value.trim();
      if (v) out.set(key, v);
    });
    var query = out.toString();
    try {
      window.history.replaceState(null, "", window.location.pathname + (query ? "?" + query : "") +
                                  window.location.hash);
    } catch (e) { /* file:// pages may refuse; the filters still apply */ }
  }
  Object.keys(controls).forEach(function (key) {
    controls[key].addEventListener(key === "q" ? "input" : "change", apply);
  });
  Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, index) {
    th.classList.add("sortable");
    th.addEventListener("click", function () {
      var up = th.getAttribute("aria-sort") !== "ascending";
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (o) { o.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", up ? "ascending" : "descending");
      var key = function (r) { var c = r.cells[index]; return c.dataset.sort || c.textContent.trim(); };
      rows.slice().sort(function (a, b) {
        var x = key(a), y = key(b);
        return (x < y ? -1 : x > y ? 1 : 0) * (up ? 1 : -1);
      }).forEach(function (r) { body.appendChild(r); });
    });
  });
  apply();
  if (window.location.hash) {
    var target = document.getElementById(decodeURIComponent(window.location.hash.slice(1)));
    if (target) target.scrollIntoView();
  }
})();
"""


def _options(select_id: str, label: str, values: Sequence[str]) -> str:
    e = html.escape
    options = "".join(f'<option value="{e(v)}">{e(v)}</option>' for v in values)
    return f'<label>{e(label)} <select id="{select_id}"><option value="">all</option>{options}</select></label>'


def to_html(m: Matrix) -> str:
    """A single self-contained page (inline CSS and script, no network): the legend, the filters (operator,
    provider, device, dtype, a search box, served rows only), one sortable table of every (operator,
    provider) row with an anchor per row (``#op.provider``) and per cell (``#op.provider.device.dtype``),
    then the providers and the operators' descriptions. The filters also read the page's query string
    (``index.html?device=cuda&dtype=float16``)."""
    e = html.escape
    providers = list(dict.fromkeys(r.provider for r in m.rows))
    heads = "".join(f'<th data-device="{e(dev)}" data-dtype="{e(dt)}">{e(dev)}<br>{e(dt)}</th>'
                    for dev in m.devices for dt in m.dtypes)
    out = ['<!DOCTYPE html>', '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           "<title>InfiniOps-Py capability matrix</title>", f"<style>{_CSS}</style></head><body>",
           "<h1>Capability matrix</h1>", f"<p>{e(_GENERATED).replace('`', '')}</p>",
           '<p id="legend"><span class="served-key">served</span>an implementation of the provider declares the '
           'device and dtype; <span class="gated-key">gated</span>none does, for the reason given (a provider '
           "that does not implement an operator has no row). <b>compute capability</b>: the minimum CUDA compute "
           "capability the implementations need (checked at run time). <b>limits</b>: each implementation's "
           "other constraints (head dims, widths, a needed import); environment requirements are listed, not "
           "evaluated, and every cuda cell needs a CUDA device. Each row and cell has an anchor: click a cell "
           "to link to it. Click a column header to sort.</p>",
           '<form id="filters" onsubmit="return false">',
           _options("f-op", "operator", [op for op, _ in m.operators]),
           _options("f-provider", "provider", providers),
           _options("f-device", "device", m.devices), _options("f-dtype", "dtype", m.dtypes),
           '<label>search <input id="f-q" type="search" placeholder="head_dim, needs triton, ..."></label>',
           '<label><input id="f-served" type="checkbox"> only rows served in the columns shown</label>',
           '<output id="count"></output></form>',
           f'<table id="matrix"><thead><tr><th>operator</th><th>provider</th>{heads}'
           "<th>compute capability</th><th>limits</th></tr></thead><tbody>"]
    for r in m.rows:
        row_id = f"{r.op}.{r.provider}"
        cells = []
        for c in r.cells:
            cell_id = e(f"{row_id}.{c.device}.{c.dtype}")
            kind, sort = ("served", 0) if c.served else ("gated", 1)
            title = f' title="served by {e(", ".join(c.implementations))}"' if c.served else ""
            cells.append(f'<td id="{cell_id}" class="{kind}" data-device="{e(c.device)}" data-dtype="{e(c.dtype)}" '
                         f'data-sort="{sort}"{title}><a href="#{cell_id}">{e(c.text())}</a></td>')
        limits = "<br>".join(e(x) for x in r.limits) or "-"
        out.append(f'<tr id="{e(row_id)}" data-op="{e(r.op)}" data-provider="{e(r.provider)}">'
                   f'<td><a href="#op-{e(r.op)}">{e(r.op)}</a></td><td><a href="#{e(row_id)}">{e(r.provider)}</a></td>'
                   f'{"".join(cells)}<td>{e(r.compute_capability_text())}</td><td class="limits">{limits}</td></tr>')
    out.append("</tbody></table>")
    out += ["<h2>Providers</h2>",
            "<table><thead><tr><th>provider</th><th>version</th><th>source</th><th>status</th></tr></thead><tbody>"]
    for p in m.providers:
        status = f'<td class="failed">{e(_status(p))}</td>' if p.error else "<td>loaded</td>"
        out.append(f"<tr><td>{e(p.name)}</td><td>{e(p.version)}</td><td>{e(p.source)}</td>{status}</tr>")
    out += ["</tbody></table>", "<h2>Operators</h2>", "<dl>"]
    for op, doc in m.operators:
        out.append(f'<dt id="op-{e(op)}"><code>{e(op)}</code></dt><dd>{e(doc) or "-"}</dd>')
    out += ["</dl>", f"<script>{_SCRIPT}</script>", "</body></html>"]
    return "\n".join(out) + "\n"


FILES: Final = {"json": "matrix.json", "markdown": "MATRIX.md", "html": "index.html"}
_RENDER: Final = {"json": to_json, "markdown": to_markdown, "html": to_html}


def write(m: Matrix, directory: str | Path, formats: Sequence[str] = tuple(FILES)) -> list[Path]:
    """Write the `formats` (default all: ``matrix.json``, ``MATRIX.md``, ``index.html``, named by `FILES`)
    into `directory`, created if needed; returns the paths written.

    Raises:
        KeyError: an unknown format. OSError: the directory or a file cannot be written.
    """
    for fmt in formats:
        if fmt not in FILES:
            raise KeyError(f"unknown matrix format {fmt!r}; known: {', '.join(FILES)}")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in formats:
        path = root / FILES[fmt]
        path.write_text(_RENDER[fmt](m), encoding="utf-8")
        written.append(path)
    return written

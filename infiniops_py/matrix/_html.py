"""The matrix as one self-contained HTML page (`to_html`): inline CSS and script, filters, sorting, anchors."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Final

from infiniops_py.matrix._build import Matrix
from infiniops_py.matrix._text import GENERATED, provider_status

__all__ = ["to_html"]

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
           "<h1>Capability matrix</h1>", f"<p>{e(GENERATED).replace('`', '')}</p>",
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
        status = f'<td class="failed">{e(provider_status(p))}</td>' if p.error else "<td>loaded</td>"
        out.append(f"<tr><td>{e(p.name)}</td><td>{e(p.version)}</td><td>{e(p.source)}</td>{status}</tr>")
    out += ["</tbody></table>", "<h2>Operators</h2>", "<dl>"]
    for op, doc in m.operators:
        out.append(f'<dt id="op-{e(op)}"><code>{e(op)}</code></dt><dd>{e(doc) or "-"}</dd>')
    out += ["</dl>", f"<script>{_SCRIPT}</script>", "</body></html>"]
    return "\n".join(out) + "\n"

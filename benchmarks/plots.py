"""Charts of the benchmark records: roofline fraction per operator and provider, model throughput, host cost.

    python benchmarks/plots.py FILE.json [FILE.json ...] [--results benchmarks/RESULTS.md] [--out benchmarks/plots]

Reads the JSON lists of records the GPU scripts write with ``--json FILE`` (benchmarks/_common.py's
`record`), and with ``--results`` the tables of a RESULTS.md that the scripts printed (`results_records`),
and writes PNGs with matplotlib's Agg canvas, at fixed pixel sizes, into ``--out`` (default
benchmarks/plots/):

- ``roofline_<script>.png`` per script whose records carry a roofline fraction (``roofline_ops.png`` from
  benchmarks/ops.py): horizontal bars, one group per operator and shape, one bar per provider, the fraction
  of the run's ceiling (copy bandwidth or bf16 matmul rate) each reached; a provider that does not serve
  the problem is marked "gated";
- ``model_throughput.png``: tokens/s of each engine per model and workload, log scale ("CUDA graphs" in
  the legend where the engine replayed CUDA graphs, "timing not stated" where a markdown table did not say);
- ``host_cost.png``: the host time per public call against the peer's call (benchmarks/gpu_host_cost.py).

Where two records name the same chart, group and bar, the later one is drawn (``--results`` is read first,
then the JSON files in order). Exit status: 0 when a chart was written, 1 when no record fits a chart, 2
for a file that cannot be read or holds an invalid record. matplotlib is a dev/bench dependency (the
``bench`` extra), needed here only, not on the GPU machine.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)  # benchmarks/_common.py, also when a test loads this file by its path
from _common import Record, check_record, record

OUT: Final = Path(__file__).resolve().parent / "plots"
DPI: Final = 100
# (width, height) in pixels of each chart: fixed, whatever the number of bars
ROOFLINE_PX: Final = (1400, 900)
MODEL_PX: Final = (1200, 900)
HOST_PX: Final = (1400, 900)


# --- reading ---------------------------------------------------------------------------------------------


def load_records(path: Path) -> list[Record]:
    """The records of one ``--json`` file.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not JSON, not a list, or an element fails `check_record` (the message names the
            file, the record's index and the key).
    """
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of records, got a {type(data).__name__}")
    for i, rec in enumerate(data):
        check_record(rec, f"{path}: record {i}")
    return data


# The tables `results_records` reads, by their exact header cells, as the scripts print them.
SIDE_BY_SIDE: Final = ("operator (bf16)", "metric", "torch", "triton", "cupy", "roofline of best",
                       "triton vs best other")  # benchmarks/ops.py, side_by_side
HOST_COST_COLUMNS: Final = ("case", "peer", "host us ours", "host us peer", "b2b us ours", "b2b us peer",
                            "graph us ours", "graph us peer", "served by")  # benchmarks/gpu_host_cost.py, COLUMNS
MODEL_TABLES: Final = {  # the third header cell -> the script that prints that table
    "transformers generate": "benchmarks/gpu_infinilm.py",
    "transformers": "benchmarks/gpu_mamba2.py",
}
_DATE = re.compile(r"^Date: (\d{4}-\d{2}-\d{2})\. Device: (.+?)\. (.+)\.$")
_CEILINGS = re.compile(r"Measured ceilings: copy ([\d.]+) GB/s, bf16 matmul ([\d.]+) TFLOP/s")
_MODEL_HEADING = re.compile(r"^### infinilm, (.+?) \(.*\), (.+), torch (\S+)$")
_ANY_DATE = re.compile(r"\b(\d{4}-\d{2}-\d{2})\b")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _number(cell: str, where: str, *, blank: bool = False) -> float | None:
    """A table cell's number; None for "-" (and for an empty cell when `blank`).

    Raises:
        ValueError: anything else, naming `where` and the cell.
    """
    if cell == "-" or (blank and not cell):
        return None
    try:
        return float(cell)
    except ValueError:
        raise ValueError(f"{where}: cell {cell!r} is not a number") from None


def _versions(text: str) -> dict[str, Any]:
    """``torch 2.11.0+cu130, triton 3.6.0, Python 3.12.3`` -> {"torch": "2.11.0+cu130", ..., "python": ...}."""
    out: dict[str, Any] = {}
    for item in text.split(", "):
        name, _, version = item.strip().partition(" ")
        if name and version:
            out[name.lower()] = version
    return out


class _Context:
    """What a table of RESULTS.md inherits from the lines above it: the run's date, device and versions (the
    last ``Date: ...`` line, or a model heading's device and torch), the ceilings of its section."""

    def __init__(self) -> None:
        self.date, self.device, self.versions = "unknown", "unknown", {}
        self.ceilings: tuple[float, float] | None = None
        self.model: tuple[str, str, dict[str, Any]] | None = None  # name, device, versions
        self.section: list[str] = []  # the lines since the last heading

    def see(self, line: str) -> None:
        if line.startswith("#"):
            self.section = []
            if line.startswith("## "):
                self.ceilings = None
            heading = _MODEL_HEADING.match(line)
            self.model = (heading[1], heading[2], {"torch": heading[3]}) if heading else None
        self.section.append(line)
        if m := _DATE.match(line):
            self.date, self.device, self.versions = m[1], m[2], _versions(m[3])
        elif self.date == "unknown" and (m := _ANY_DATE.search(line)):
            self.date = m[1]
        if m := _CEILINGS.search(line):
            self.ceilings = float(m[1]), float(m[2])

    def stamp(self, rec: Record, device: str | None = None, versions: dict[str, Any] | None = None) -> Record:
        return {**rec, "device": device or self.device, "versions": versions or self.versions, "date": self.date}


def _side_by_side(rows: list[tuple[int, list[str]]], ctx: _Context, where: str) -> list[Record]:
    if ctx.ceilings is None:
        raise ValueError(f"{where}: the side-by-side table has no 'Measured ceilings: copy X GB/s, bf16 matmul Y "
                         "TFLOP/s.' line above it in its section: its roofline fractions need them")
    copy, matmul = ctx.ceilings
    out = []
    for n, cells in rows:
        name, metric = cells[0], cells[1]
        if metric not in ("GB/s", "TFLOP/s"):
            raise ValueError(f"{where} line {n}: metric {metric!r}; expected GB/s or TFLOP/s")
        for provider, cell in zip(SIDE_BY_SIDE[2:5], cells[2:5]):
            noted = cell.startswith(("gated", "error"))
            rate = None if noted else _number(cell, f"{where} line {n}")
            ceiling = copy if metric == "GB/s" else matmul
            out.append(ctx.stamp(record(
                "operator", "benchmarks/ops.py", name.split()[0], provider, name, rate=rate, metric=metric,
                roofline=None if rate is None else rate / ceiling,
                note=cell if noted else f"{where} line {n} (no time per call in the table)")))
    return out


def _host_cost(header: list[str], rows: list[tuple[int, list[str]]], ctx: _Context, where: str) -> list[Record]:
    col = {name: header.index(name) for name in HOST_COST_COLUMNS}
    out = []
    for n, cells in rows:
        case = cells[col["case"]]
        sides = (("ours", cells[col["served by"]], "ours"), ("peer", cells[col["peer"]], "peer"))
        for role, who, column in sides:
            for timing, kind in (("host", "host"), ("eager", "b2b"), ("graph replay", "graph")):
                us = _number(cells[col[f"{kind} us {column}"]], f"{where} line {n}")
                out.append(ctx.stamp(record("operator", "benchmarks/gpu_host_cost.py", case.split()[0], who, case,
                                            role=role, ms=None if us is None else us / 1e3, timing=timing,
                                            note=f"{where} line {n}")))
    return out


def _model(header: list[str], rows: list[tuple[int, list[str]]], ctx: _Context, where: str) -> list[Record]:
    if ctx.model is None:
        raise ValueError(f"{where}: a model table with no '### infinilm, <model> (...), <device>, torch <version>' "
                         "heading above it")
    name, device, versions = ctx.model
    source = MODEL_TABLES[header[2]]
    said = " ".join(ctx.section)
    decode_timing = ("graph replay" if "cuda graphs: on" in said else "eager" if "cuda graphs: off" in said
                     else "unknown")  # the engine's graph status, where the section quotes it
    out = []
    for n, cells in rows:
        label = cells[0]
        if "(tok/s)" not in label:
            continue  # the step-time rows: milliseconds, not a throughput
        shape, _, suffix = (part.strip(" ,") for part in label.partition("(tok/s)"))
        for provider, cell in zip(("infinilm", "transformers"), cells[1:3]):
            rate = _number(cell, f"{where} line {n}", blank=True)
            if rate is None:
                continue
            if provider == "transformers":
                timing = "eager"  # transformers' generate and forward launch eagerly
            elif suffix in ("CUDA graph", "eager"):
                timing = "graph replay" if suffix == "CUDA graph" else "eager"
            elif "prefill" in shape and source == "benchmarks/gpu_infinilm.py":
                timing = "eager"  # that script's engine captures no prefill graphs (no prefill_graph_lengths)
            else:
                timing = decode_timing if "decode" in shape else "unknown"
            out.append(ctx.stamp(record("model", source, name, provider, shape,
                                        role="ours" if provider == "infinilm" else "peer", rate=rate, metric="tok/s",
                                        timing=timing, note=f"{where} line {n}"), device, versions))
    return out


def results_records(path: Path) -> list[Record]:
    """Records from the tables of a RESULTS.md that benchmarks/ops.py (providers side by side), gpu_host_cost.py
    and gpu_infinilm.py / gpu_mamba2.py printed, recognized by their exact header cells (`SIDE_BY_SIDE`,
    `HOST_COST_COLUMNS`, `MODEL_TABLES`); other tables are skipped. Each record's date, device and versions
    are those of the last ``Date: ...`` line above its table (a model table: its heading's device and torch).

    The side-by-side table's roofline fractions are each rate over the ``Measured ceilings`` line of its
    section (copy GB/s, bf16 matmul TFLOP/s); it has no time per call (``ms`` None). A model row's timing: its
    label's ", CUDA graph" or ", eager"; for a decode row, the engine's graph status where its section quotes
    it ("cuda graphs: on" or "off"); eager for gpu_infinilm.py's prefill (it captures no prefill graphs) and
    for transformers; "unknown" otherwise.

    Raises:
        OSError: the file cannot be read.
        ValueError: a recognized table's cell is not a number (or a gated/error note where a provider may have
            one), or its section lacks what it needs (the ceilings, the model heading); the message names the
            line.
    """
    ctx, out = _Context(), []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("|"):
            ctx.see(lines[i])
            i += 1
            continue
        start = i
        while i < len(lines) and lines[i].startswith("|"):
            i += 1
        header = _cells(lines[start])
        rows = [(start + 3 + k, _cells(line)) for k, line in enumerate(lines[start + 2:i])]  # 1-based line numbers
        where = f"{path}"
        if tuple(header) == SIDE_BY_SIDE:
            out += _side_by_side(rows, ctx, where)
        elif set(HOST_COST_COLUMNS) <= set(header):
            out += _host_cost(header, rows, ctx, where)
        elif len(header) == 4 and header[0] == "metric" and header[1] == "infinilm" and header[2] in MODEL_TABLES:
            out += _model(header, rows, ctx, where)
    for k, rec in enumerate(out):
        check_record(rec, f"{path}: record {k}")
    return out


# --- drawing ---------------------------------------------------------------------------------------------


def _figure(px: tuple[int, int]) -> Any:
    """A matplotlib Figure of `px` pixels at `DPI`, on the Agg canvas (no pyplot, no global backend)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(px[0] / DPI, px[1] / DPI), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _grouped(records: Sequence[Record], group: Callable[[Record], str], series: Callable[[Record], str],
             ) -> tuple[list[str], list[str], dict[tuple[str, str], Record]]:
    """Groups and series in order of first appearance, and the last record of each (group, series)."""
    cells: dict[tuple[str, str], Record] = {}
    for r in records:
        cells[group(r), series(r)] = r
    groups = list(dict.fromkeys(g for g, _ in cells))
    names = list(dict.fromkeys(s for _, s in cells))
    return groups, names, cells


def _barh(ax: Any, groups: list[str], names: list[str], cells: dict[tuple[str, str], Record],
          value: Callable[[Record], float | None], label: Callable[[float], str],
          missing: Callable[[Record], str]) -> None:
    """Horizontal grouped bars: a row per group (the first at the top), a colour per series; each bar labelled
    with `label` of its value, a record without a value with `missing` of it at the axis."""
    height = 0.8 / max(1, len(names))
    for s, name in enumerate(names):
        ys, xs, texts = [], [], []
        for g, grp in enumerate(groups):
            rec = cells.get((grp, name))
            if rec is None:
                continue
            y = g + (s - (len(names) - 1) / 2) * height
            v = value(rec)
            if v is None:
                ax.text(0, y, f" {missing(rec)}", va="center", fontsize=7, color="0.4")
                continue
            ys.append(y)
            xs.append(v)
            texts.append(label(v))
        bars = ax.barh(ys, xs, height=height, label=name)
        ax.bar_label(bars, labels=texts, fontsize=7, padding=2)
    ax.set_yticks(range(len(groups)), groups, fontsize=8)
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)


def _where(records: Sequence[Record]) -> str:
    devices = ", ".join(dict.fromkeys(r["device"] for r in records))
    dates = sorted({r["date"] for r in records})
    return f"{devices}; {dates[0]}" + (f" to {dates[-1]}" if len(dates) > 1 else "")


def roofline_chart(records: Sequence[Record], path: Path) -> bool:
    """Bars of the roofline fraction per operator and shape (a group) and provider (a bar), of the operator
    records that have one or a note saying why not (a gated provider); False, writing nothing, when no record
    has a fraction."""
    mine = [r for r in records if r["kind"] == "operator" and r["metric"] and r["timing"] != "host"]
    if not any(r["roofline"] is not None for r in mine):
        return False
    groups, names, cells = _grouped(mine, lambda r: r["shape"], lambda r: r["provider"])
    fig = _figure(ROOFLINE_PX)
    ax = fig.subplots()
    _barh(ax, groups, names, cells, lambda r: r["roofline"], lambda v: f"{v:.0%}",
          lambda r: (r["note"] or "not measured").split(":")[0])
    ax.axvline(1.0, color="0.3", linestyle="--", linewidth=1)
    top = max(r["roofline"] for r in cells.values() if r["roofline"] is not None)
    ax.set_xlim(0, max(1.1, top * 1.1))
    ax.xaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    sources = ", ".join(dict.fromkeys(r["source"] for r in mine))
    ax.set_xlabel("fraction of the run's ceiling (copy bandwidth for GB/s, bf16 matmul for TFLOP/s)")
    ax.set_title(f"Roofline fraction per operator and provider ({sources}; {_where(mine)})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return True


_TIMING_SUFFIX: Final = {"graph replay": " (CUDA graphs)", "unknown": " (timing not stated)"}  # model legend


def model_chart(records: Sequence[Record], path: Path) -> bool:
    """Bars of tokens/s per model and workload (a group) and engine (a bar; "CUDA graphs" added where it
    replayed CUDA graphs, "timing not stated" for an unknown timing), log scale; False, writing nothing,
    without a model record with a rate."""
    mine = [r for r in records if r["kind"] == "model" and r["rate"] is not None]
    if not mine:
        return False
    groups, names, cells = _grouped(
        mine, lambda r: f"{r['operator']}: {r['shape']}",
        lambda r: r["provider"] + _TIMING_SUFFIX.get(r["timing"], ""))
    fig = _figure(MODEL_PX)
    ax = fig.subplots()
    _barh(ax, groups, names, cells, lambda r: r["rate"], lambda v: f"{v:,.0f}", lambda r: "")
    ax.set_xscale("log")
    ax.set_xlim(right=max(r["rate"] for r in mine) * 8)
    ax.set_xlabel("tokens/s (log scale)")
    ax.set_title(f"Model throughput ({_where(mine)})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return True


def host_chart(records: Sequence[Record], path: Path) -> bool:
    """Bars of the host microseconds per call of our public call and of the peer's, per case; False, writing
    nothing, without a host record that has a time."""
    mine = [r for r in records if r["timing"] == "host" and r["ms"] is not None]
    if not mine:
        return False
    peers = {r["shape"]: r["provider"] for r in mine if r["role"] == "peer"}
    groups, names, cells = _grouped(
        mine, lambda r: f"{r['shape']} (peer: {peers.get(r['shape'], '-')})",
        lambda r: "InfiniOps-Py public call" if r["role"] == "ours" else "peer")
    fig = _figure(HOST_PX)
    ax = fig.subplots()
    _barh(ax, groups, names, cells, lambda r: r["ms"] * 1e3, lambda v: f"{v:.0f}", lambda r: "")
    ax.set_xlabel("host time per call, microseconds (CPU time for the call to return)")
    ax.set_title(f"Host cost per call ({_where(mine)})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return True


def write_charts(records: Sequence[Record], out: Path) -> list[Path]:
    """Every chart `records` fill, into `out` (created): the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for source in dict.fromkeys(r["source"] for r in records if r["roofline"] is not None):
        path = out / f"roofline_{Path(source).stem}.png"
        if roofline_chart([r for r in records if r["source"] == source], path):
            written.append(path)
    for name, chart in (("model_throughput.png", model_chart), ("host_cost.png", host_chart)):
        if chart(records, out / name):
            written.append(out / name)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="*", type=Path, help="record files written by the GPU scripts' --json")
    parser.add_argument("--results", type=Path, help="also read the script tables of this RESULTS.md")
    parser.add_argument("--out", type=Path, default=OUT, help=f"folder for the PNGs (default {OUT})")
    args = parser.parse_args(argv)
    if not args.json and args.results is None:
        parser.error("give record files (FILE.json ...) or --results RESULTS.md, or both")
    try:
        records = results_records(args.results) if args.results else []
        for path in args.json:
            records += load_records(path)
    except (OSError, ValueError) as err:
        print(f"plots: {err}", file=sys.stderr)
        return 2
    written = write_charts(records, args.out)
    for path in written:
        print(f"wrote {path}")
    if not written:
        print(f"plots: none of the {len(records)} records has a roofline fraction, a model throughput or a host "
              "time: no chart written", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

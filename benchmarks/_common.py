"""Helpers shared by the GPU benchmark scripts (gpu_dense, gpu_attention, gpu_ssm, ops, gpu_infinilm, gpu_mamba2).

The scripts run as ``python3 benchmarks/<script>.py`` (this folder is then on ``sys.path``), are imported by
benchmarks/ops.py after it puts this folder on ``sys.path``, and are loaded by file path in the tests; each
script puts this folder on ``sys.path`` itself before importing this module.

Machine-readable results: every timing script takes ``--json FILE`` and writes there a JSON list of records
(`record` builds one, `write_records` stamps the device, versions and date on each and writes the file);
benchmarks/plots.py reads them back (`check_record`) and draws the charts.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import torch

Timer = Callable[[Callable[[], Any]], float]  # milliseconds per call of a no-argument function
Row = dict[str, Any]  # one line of a family's table: ``kind`` "check" or "perf"
Record = dict[str, Any]  # one machine-readable measurement: the keys of `RECORD_KEYS`

# A record's keys and the types their values may have (None: not measured, or not meaningful for the row).
RECORD_KEYS: Final[dict[str, tuple[type, ...]]] = {
    "kind": (str,),  # one of KINDS
    "source": (str,),  # the script (or markdown file) the numbers come from
    "operator": (str,),  # the operator's name ("rms_norm"); for a "model" record, the model ("Qwen3-0.6B shape")
    "provider": (str,),  # who ran it: a provider ("triton"), a peer ("SDPA", "transformers"), an engine
    "role": (str,),  # one of ROLES: this project's code or a peer's
    "shape": (str,),  # the case's label: sizes, layout, dtype ("rms_norm [32768, 4096]", "batch-1 decode")
    "ms": (float, type(None)),  # time per call, milliseconds (a model: per generate call, step or forward)
    "rate": (float, type(None)),  # achieved bandwidth or throughput, in `metric` units
    "metric": (str, type(None)),  # "GB/s", "TFLOP/s", "Mtok/s" or "tok/s"
    "roofline": (float, type(None)),  # `rate` over the measured ceiling of the run (copy bandwidth, matmul rate)
    "timing": (str,),  # one of TIMINGS
    "note": (str,),  # why a value is missing (a gate's reason, a crash), or what else the row says
    "device": (str,),  # torch.cuda.get_device_name(), or "cpu"
    "versions": (dict,),  # distribution or runtime -> version string (None: not installed)
    "date": (str,),  # ISO date of the run
}
KINDS: Final = ("operator", "model")
ROLES: Final = ("ours", "peer")
# eager: calls launched one after another; graph replay: one call captured in a CUDA graph, per replay;
# host: the CPU time a call takes to return; unknown: the source does not say (older markdown tables)
TIMINGS: Final = ("eager", "graph replay", "host", "unknown")
_STAMPED: Final = ("device", "versions", "date")  # what `write_records` adds


@contextlib.contextmanager
def captured(fn: Callable[[], Any]) -> Iterator[torch.cuda.CUDAGraph]:
    """One call of `fn` captured in a CUDA graph, after one run on a side stream (what ``torch.cuda.graph`` asks
    of code that allocates); the graph and its memory pool are dropped at exit."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    try:
        yield graph
    finally:
        del graph


def median_ms(fn: Callable[[], Any]) -> float:
    """``triton.testing.do_bench``'s median, in milliseconds (CUDA; its default 25 ms warm-up, 100 ms of runs)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, return_mode="median"))


def randn(*shape: int, dtype: torch.dtype, device: str, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Standard normal float32 draws from `gen` on `device`, times `scale`, cast to `dtype`."""
    return (torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * scale).to(dtype)


def copy_bandwidth_gbs(device: str = "cuda", nbytes: int = 2 << 30, timer: Timer = median_ms, *,
                       fill: bool = False) -> float:
    """Device-to-device copy, counting the bytes read and written; `fill`: random bytes in the source first."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    if fill:
        src.random_(0, 255)
    return 2 * nbytes / timer(lambda: dst.copy_(src)) / 1e6


def matmul_tflops(device: str = "cuda", n: int = 8192, timer: Timer = median_ms) -> float:
    """bf16 ``a @ b`` at n^3, in TFLOP/s."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    return 2 * n**3 / timer(lambda: a @ b) / 1e9


def resolved_call(provider: str, op: str, problem: dict[str, Any], *args: Any, **kwargs: Any) -> Callable[[], Any]:
    """A no-argument call of `provider`'s implementation of `op` (its calling convention), index checks off."""
    import infiniops_py  # here, not at the top: benchmarks/plots.py reads records without the operators

    with infiniops_py.use(provider):
        fn = infiniops_py.resolve(op, **problem).fn

    def call() -> Any:
        with infiniops_py.unchecked_indices():
            return fn(*args, **kwargs)

    return call


def check_row(family: str, name: str, dtype: torch.dtype, check: Callable[[], tuple[bool, float, str]]) -> Row:
    """Run one correctness case (`check()`: ok, worst |err|, failure message) and print its PASS/FAIL line; a
    crash is a FAIL of this case."""
    try:
        ok, worst, message = check()
    except Exception as e:  # a crash is a FAIL of this case, the run goes on
        ok, worst, message = False, math.inf, f"{type(e).__name__}: {e}"
    row = {"kind": "check", "family": family, "case": f"{name} {str(dtype)[6:]}", "status": "PASS" if ok else "FAIL",
           "worst": worst, "note": message[:300]}
    print(f"{row['status']} {row['case']}: max |err| {worst:.3g} {message[:300]}", flush=True)
    return row


def perf_row(family: str, case: str, metric: str, triton_v: float, torch_v: float, baseline: str, baseline_v: float,
             roofline: float, target: str, ok: bool, note: str, *, op: str = "",
             ms: Mapping[str, float] | None = None) -> Row:
    """One timing line: Triton's and the torch provider's rates, a baseline's, the roofline fraction, the target;
    `op` the operator timed and `ms` the milliseconds per call of each call timed ("triton", "torch", and the
    baseline's name when it was measured in the run, not quoted), for `perf_records`."""
    return {"kind": "perf", "family": family, "case": case, "metric": metric, "triton": triton_v, "torch": torch_v,
            "baseline": baseline, "baseline_value": baseline_v, "vs_torch": triton_v / torch_v if torch_v else math.nan,
            "roofline": roofline, "target": target, "status": "PASS" if ok else "MISS", "note": note, "op": op,
            "ms": dict(ms or {})}


def run_perf(results: list[Row], family: str, benches: Sequence[tuple[str, Callable[[], Row]]],
             table: Callable[[list[Row]], str] | None = None) -> None:
    """Append each benchmark's line to `results`, a crash as a MISS line; with `table`, free the CUDA cache and
    print each line as it comes."""
    for name, bench in benches:
        try:
            results.append(bench())
        except Exception as e:  # report and go on to the next benchmark
            results.append({"kind": "perf", "family": family, "case": name, "status": "MISS",
                            "note": f"crashed: {type(e).__name__}: {e}"[:300]})
        if table is not None:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            print(table(results[-1:]), flush=True)


def format_rows(results: list[Row], case: int, status: int, rate: str = ".0f", ratio: str = ".2f") -> list[str]:
    """The compact table's lines: `case` and `status` column widths, `rate` and `ratio` number formats."""
    lines = []
    for r in results:
        head = f"{r['case']:<{case}} {r['status']:<{status}}"
        if r["kind"] == "check":
            lines.append(f"{head} max|err| {r['worst']:.3g} {r['note'][:60]}")
        elif "triton" in r:
            lines.append(f"{head} triton {r['triton']:{rate}} {r['metric']}, torch {r['torch']:{rate}} "
                         f"({r['vs_torch']:{ratio}}x), {r['baseline']} {r['baseline_value']:{rate}}, "
                         f"roofline {r['roofline']:.0%}; target {r['target']}: {r['note']}")
        else:
            lines.append(f"{head} {r['note']}")
    return lines


def bench_main(name: str, run: Callable[[list[Row]], None], table: Callable[[list[Row]], str], *,
               header: int | None = None, wall_time: bool = False,
               records: Callable[[list[Row]], list[Record]] | None = None, argv: Sequence[str] | None = None) -> int:
    """A family script's entry point: parses `argv` (default ``sys.argv[1:]``: ``--json FILE``), needs CUDA,
    runs, prints the table (after a ``case``/``status`` header of width `header`, and the total wall time when
    asked), and with ``--json`` writes `records` of the results (default: `perf_records`); 0 when every line
    passed, 1 otherwise, 2 without CUDA (argparse exits with status 2 for an unknown argument)."""
    parser = argparse.ArgumentParser(prog=f"{name}.py", description=f"benchmarks/{name}.py (on a CUDA device)")
    json_option(parser)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"{name}: needs a CUDA device", file=sys.stderr)
        return 2
    results: list[Row] = []
    start = time.perf_counter()
    run(results)
    if wall_time:
        print(f"\n{name}: {time.perf_counter() - start:.0f} s in all")
    if header is not None:
        print(f"\n{'case':<{header}} status")
    print(table(results))
    if args.json:
        rows = records(results) if records else perf_records(results, f"benchmarks/{name}.py")
        write_records(args.json, rows, "cuda")
    return 0 if all(r["status"] == "PASS" for r in results) else 1


def model_device(smoke: bool) -> str | None:
    """The model scripts' device: the CPU for ``--smoke``, else CUDA; None, after saying so, when CUDA is missing."""
    if smoke:
        return "cpu"
    if not torch.cuda.is_available():
        print("needs a CUDA device (or --smoke)", file=sys.stderr)
        return None
    return "cuda"


def hf_generate_tokens_per_s(model: torch.nn.Module, ids: torch.Tensor, output_len: int, *,
                             min_new_tokens: bool = False) -> float:
    """transformers' greedy ``generate`` on `ids`: (output_len - 1) tokens per row over the time past the first
    token, after a 4-token warm-up; `min_new_tokens`: also ask for at least that many tokens. NaN when the
    full-length call took no longer than the 1-token call (the timing noise exceeds the decode time: a larger
    `output_len` is needed), not a negative or infinite rate."""
    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)

    def timed(n: int) -> float:
        extra = {"min_new_tokens": n} if min_new_tokens else {}
        sync()
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0, **extra)
        sync()
        return time.perf_counter() - start

    timed(4)  # warm-up
    first, full = timed(1), timed(output_len)
    return ids.shape[0] * (output_len - 1) / (full - first) if full > first else math.nan


def p50_ms(seconds: Sequence[float]) -> float:
    """The median (upper middle) of step times in seconds, in milliseconds."""
    return sorted(seconds)[len(seconds) // 2] * 1e3


# --- machine-readable records ------------------------------------------------------------------------------


def _finite(value: float | None) -> float | None:
    """`value` as a float, None for None, NaN or an infinity (JSON has no NaN)."""
    return float(value) if value is not None and math.isfinite(value) else None


def record(kind: str, source: str, operator: str, provider: str, shape: str, *, role: str = "ours",
           ms: float | None = None, rate: float | None = None, metric: str | None = None,
           roofline: float | None = None, timing: str = "eager", note: str = "") -> Record:
    """One measurement, without the environment fields (`write_records` adds them); a NaN or infinite number
    becomes None.

    Raises:
        ValueError: `kind`, `role` or `timing` is not one of `KINDS`, `ROLES`, `TIMINGS`.
    """
    out = {"kind": kind, "source": source, "operator": operator, "provider": provider, "role": role,
           "shape": shape, "ms": _finite(ms), "rate": _finite(rate), "metric": metric,
           "roofline": _finite(roofline), "timing": timing, "note": note}
    check_record(out, "record", stamped=False)
    return out


def check_record(rec: Any, where: str, *, stamped: bool = True) -> None:
    """Raise ValueError, naming `where` (a file and index), unless `rec` is a dict with exactly the keys of
    `RECORD_KEYS` (less the device, versions and date when not `stamped`), each of an allowed type, and its
    kind, role and timing are known names."""
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: a record must be a JSON object, got {type(rec).__name__}")
    keys = {k: v for k, v in RECORD_KEYS.items() if stamped or k not in _STAMPED}
    missing, extra = sorted(set(keys) - set(rec)), sorted(set(rec) - set(keys))
    if missing or extra:
        raise ValueError(f"{where}: keys missing: {', '.join(missing) or 'none'}; unknown keys: "
                         f"{', '.join(extra) or 'none'}; a record has exactly: {', '.join(keys)}")
    for key, types in keys.items():
        value = rec[key]
        if float in types and isinstance(value, int) and not isinstance(value, bool):
            continue  # JSON writes 3.0 as 3.0, but a hand-written 3 is a number too
        if not isinstance(value, types) or isinstance(value, bool):
            allowed = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise ValueError(f"{where}: {key} = {value!r} ({type(value).__name__}); it must be {allowed}")
    for key, names in (("kind", KINDS), ("role", ROLES), ("timing", TIMINGS)):
        if rec[key] not in names:
            raise ValueError(f"{where}: {key} = {rec[key]!r}; it must be one of {', '.join(names)}")


def _version(*distributions: str) -> str | None:
    """The installed version of the first of `distributions` that is installed (no import), or None."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def environment(device: str) -> dict[str, Any]:
    """The device name (CUDA's, or ``"cpu"``), the versions of torch (with its CUDA), triton, cupy,
    transformers, infiniops-py and Python, and today's ISO date."""
    name = torch.cuda.get_device_name() if device.startswith("cuda") and torch.cuda.is_available() else "cpu"
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": _version("triton"),
                "cupy": _version("cupy", "cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x"),
                "transformers": _version("transformers"), "infiniops-py": _version("infiniops-py"),
                "python": sys.version.split()[0]}
    return {"device": name, "versions": versions, "date": datetime.date.today().isoformat()}


def write_records(path: Path, records: Iterable[Record], device: str) -> None:
    """Write `records`, each stamped with `environment(device)`, to `path` as a JSON list (parents created).

    Raises:
        ValueError: a record fails `check_record`.
        OSError: the file cannot be written.
    """
    env = environment(device)
    stamped = [{**r, **env} for r in records]
    for i, rec in enumerate(stamped):
        check_record(rec, f"{path}: record {i}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stamped, indent=1, allow_nan=False) + "\n")
    print(f"wrote {len(stamped)} records to {path}", flush=True)


def perf_records(results: Sequence[Row], source: str) -> list[Record]:
    """The records of a family table's timing lines (``kind`` "perf" with ``ms``): one per call timed in the
    row (Triton, the torch provider, the measured baseline), eager. Each one's roofline is its rate over
    the row's ceiling, the Triton rate over the row's roofline fraction (every family's fraction is its
    rate over a fixed ceiling: the copy bandwidth, the matmul rate or the scan's ideal time)."""
    out = []
    for r in results:
        if r.get("kind") != "perf" or not r.get("ms"):
            continue
        ceiling = r["triton"] / r["roofline"] if r["roofline"] else math.nan
        for who, ms in r["ms"].items():
            rate = r["baseline_value"] if who == r["baseline"] and who not in ("triton", "torch") else r[who]
            out.append(record("operator", source, r["op"], who, r["case"], role="ours" if who in ("triton", "torch")
                              else "peer", ms=ms, rate=rate, metric=r["metric"], roofline=rate / ceiling))
    return out


def json_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--json FILE`` (the machine-readable records) to `parser`."""
    parser.add_argument("--json", type=Path, metavar="FILE",
                        help="also write the measurements as a JSON list of records to FILE")

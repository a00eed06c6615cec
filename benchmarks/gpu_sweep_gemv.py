"""The decode Gemm's variants on the GPU (issue #23): every `infiniops_triton._gemv.Variant` of a row class at the
decode projection shapes, beside cuBLAS, and the table of winners to set `_gemv.TABLE` from.

    python3 -m pip install -q --no-deps --no-build-isolation -e . -e providers/torch -e providers/triton
    python3 benchmarks/gpu_sweep_gemv.py [--json FILE] [--emit TABLE.json] [--jobs 12]   # ~3 min on an H200
    python3 benchmarks/gpu_sweep_gemv.py --smoke          # tiny sizes on the CPU, the interpreter: the script

Shapes (x ``[M, K]`` by an ``nn.Linear`` weight ``[N, K]``, bf16): Qwen3-0.6B qkv, o, gate_up, down; Mamba-2-130m
in_proj, out_proj; Llama-3-8B qkv, gate_up, down (for reference), at M 1, 8, 16, 32, 64. For each (shape, M):

- cuBLAS: ``F.linear``; default: the Triton provider's public ``gemm`` as it stands (the autotuned GEMV up to 16
  rows, the tiled kernel beyond, `_gemv.TABLE` emptied); each variant of the row class (`_gemv.launch` with it).
- The gate_up shapes again as ``gemm_swiglu`` (SiLU-and-multiply in the epilogue, ``[M, N / 2]`` out): torch
  (``F.linear`` then ``F.silu(gate) * up``), default (the public ``gemm_swiglu``), each variant with ``swiglu``.

Every call is checked first (output poisoned) against the float64 product with the project's bf16 rule
(`infiniops_py.testing`'s gemm / gemm_swiglu tolerance); a variant that fails is reported and never wins. Timing:
one CUDA graph of 20 back-to-back calls over distinct weight copies (past the 50 MB L2 together, as a model's
layers are), the median of 20 replays, per call: graph replay against graph replay, same run, same inputs. GB/s
counts the weight, x and out bytes of a call; "of copy" divides by the run's measured copy bandwidth.

The variants compile first in ``--jobs`` worker processes (each launches its share once, eagerly, filling
Triton's on-disk kernel cache), so the timed process only loads them; the default's autotuning (whose candidates
are the first variants of each row class: the same binaries) runs in the timed process, on a quiet GPU.

Output: one table per shape kind (the best variant per row), then the winners per ``_gemv.TABLE`` key (row class,
N, K, swiglu): the variant with the least summed time over the class's M values, kept only where it beats the
default by 2% or more; printed as Python lines for ``_gemv.TABLE`` and, with ``--emit FILE``, written as the JSON
that ``INFINIOPS_GEMV_TABLE=FILE`` loads. Exit status 1 when a default or cuBLAS output fails the rule.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import infiniops_py as ops

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
import gpu_decode
from _common import copy_bandwidth_gbs, json_option

SHAPES = {  # name: (K, N) of the nn.Linear weight [N, K]
    "qwen3-0.6b qkv": (1024, 4096), "qwen3-0.6b o": (2048, 1024), "qwen3-0.6b gate_up": (1024, 6144),
    "qwen3-0.6b down": (3072, 1024), "mamba2-130m in_proj": (768, 3352), "mamba2-130m out_proj": (1536, 768),
    "llama3-8b qkv": (4096, 6144), "llama3-8b gate_up": (4096, 28672), "llama3-8b down": (14336, 4096),
}
SWIGLU = ("qwen3-0.6b gate_up", "llama3-8b gate_up")
ROWS = (1, 8, 16, 32, 64)
SMOKE_SHAPES = {"tiny": (48, 40), "tiny gate_up": (40, 2 * 24)}
SMOKE_SWIGLU = ("tiny gate_up",)
CALLS = 20  # calls per captured graph
L2_PAST = 160 << 20  # bytes of distinct weights per graph: past the H200's 50 MB L2


def _variants(row_class: int, smoke: bool) -> list[Any]:
    """The candidates of a row class (`_gemv.SWEEP_ONE_ROW`, `_gemv.SWEEP_TILE`: the autotuner's own first)."""
    from infiniops_triton import _gemv
    from infiniops_triton._gemv import Variant as V

    if smoke:
        return [V(8, 32, 1, 4), V(4, 16, 2, 4, evict=True, pipe=2, unroll=2, sum_each=True)] if row_class == 1 else \
            [V(16, 32, 2, 4, 1), V(32, 16, 1, 4, 2, evict=True)]
    return list(_gemv.SWEEP_ONE_ROW if row_class == 1 else _gemv.SWEEP_TILE)


def _cells(smoke: bool, rows: tuple[int, ...]) -> list[tuple[str, int, int, int, bool]]:
    """(shape name, M, K, N out, swiglu) of every measured cell."""
    shapes, swiglu = (SMOKE_SHAPES, SMOKE_SWIGLU) if smoke else (SHAPES, SWIGLU)
    cells = [(name, m, k, n, False) for name, (k, n) in shapes.items() for m in rows]
    cells += [(name, m, shapes[name][0], shapes[name][1] // 2, True) for name in swiglu for m in rows]
    return cells


def _gemm_default(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    with ops.use("triton", op="gemm"):
        return ops.gemm(x, w, trans_b=True, out=out)


def _swiglu_default(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    with ops.use("triton", op="gemm_swiglu"):
        return ops.gemm_swiglu(x, w, None, out=out)


def _torch_swiglu(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    gate, up = F.linear(x, w).chunk(2, dim=-1)
    return F.silu(gate) * up


def _variant_call(v: Any, swiglu: bool) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    from infiniops_triton import _gemv

    def call(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        m, k = x.shape
        return _gemv.launch(x, w, m, out.shape[1], k, x.stride(0), w.stride(0), None, None, 1.0, 0.0, out,
                            swiglu=swiglu, variant=v)
    return call


def _candidates(m: int, swiglu: bool, smoke: bool) -> list[tuple[str, Any]]:
    """(label, call or variant) of a cell: the default, then the variants of its row class."""
    from infiniops_triton import _gemv

    return [("default", None), *((f"{v}", v) for v in _variants(_gemv.row_class(m), smoke))]


def _warm(cells: list[tuple[str, int, int, int, bool]], smoke: bool) -> int:
    """A worker: launch each cell's variants once (and the default beyond 16 rows: the tiled kernel, one
    configuration, nothing timed), compiling them into Triton's cache; the number of launches."""
    if smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("INFINIOPS_TRITON_INTERPRET_CPU", "1")
        ops.reload()
    device = torch.device("cpu" if smoke else "cuda")
    from infiniops_triton import _gemv

    _gemv.TABLE.clear()
    launched = 0
    for _, m, k, n, swiglu in cells:
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        w = torch.randn((2 if swiglu else 1) * n, k, device=device, dtype=torch.bfloat16) * k**-0.5
        out = torch.empty(m, n, device=device, dtype=torch.bfloat16)
        for _, v in _candidates(m, swiglu, smoke):
            if v is None and m <= _gemv.MAX_ROWS:  # autotuned: timed in the measuring process
                continue
            try:
                if v is None:
                    (_swiglu_default if swiglu else _gemm_default)(x, w, out)
                else:
                    _variant_call(v, swiglu)(x, w, out)
                launched += 1
            except Exception as err:  # reported again (and counted) by the timed process
                print(f"warm-up {m}x{k}->{n} {v}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
    return launched


def warm_up(cells: list[tuple[str, int, int, int, bool]], jobs: int, smoke: bool) -> None:
    """Compile in `jobs` processes (cells dealt round-robin, the biggest weights spread first)."""
    if jobs <= 0:
        return
    start = time.perf_counter()
    order = sorted(cells, key=lambda c: -c[2] * c[3])
    shares = [order[i::jobs] for i in range(jobs)]
    import multiprocessing

    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        launched = sum(pool.map(_warm, shares, [smoke] * jobs))
    print(f"warm-up: {launched} launches in {jobs} processes, {time.perf_counter() - start:.1f} s", flush=True)


def graph_time(calls: list[Callable[[], Any]], device: torch.device, replays: int = 20) -> float:
    """Seconds per call of `calls` as `gpu_decode.graph_time` measures it (one CUDA graph of all of them, the median
    of `replays` replays); on the CPU (``--smoke``) the eager wall time instead, so the script runs through."""
    if device.type == "cuda":
        return gpu_decode.graph_time(calls, device, replays)
    for fn in calls:
        fn()
    start = time.perf_counter()
    for fn in calls:
        fn()
    return (time.perf_counter() - start) / len(calls)

def _reference(x: torch.Tensor, w: torch.Tensor, swiglu: bool) -> torch.Tensor:
    """The float64 product ``x @ w.T`` (its SiLU-and-multiply with `swiglu`)."""
    ref = x.double() @ w.double().t()
    if swiglu:
        gate, up = ref.chunk(2, dim=-1)
        ref = F.silu(gate) * up
    return ref


def _check(got: torch.Tensor, ref: torch.Tensor, k: int, swiglu: bool) -> str | None:
    """None when `got` meets the bf16 rule against the float64 `ref`, else the failure."""
    from infiniops_py.testing.compare import compare
    from infiniops_py.testing.tolerances import tolerance

    op = "gemm_swiglu" if swiglu else "gemm"
    _, failure = compare(op, got, ref, tolerance(op, "bfloat16"), k=k)
    return None if failure is None else str(failure)[:200]


def bench_cell(cell: tuple[str, int, int, int, bool], device: torch.device, smoke: bool,
               copy_bw: float) -> tuple[list[dict[str, Any]], bool]:
    """The rows of one (shape, M, swiglu) cell: the baseline, the default, every variant; and whether the
    baseline and the default met the rule."""
    name, m, k, n, swiglu = cell
    gen = torch.Generator(device=device).manual_seed(m * n + k + swiglu)
    rows_w = (2 if swiglu else 1) * n
    nbytes = rows_w * k * 2
    copies = 2 if smoke else min(CALLS, max(2, math.ceil(L2_PAST / nbytes)))
    weights = [torch.randn(rows_w, k, generator=gen, device=device, dtype=torch.bfloat16) * k**-0.5
               for _ in range(copies)]
    calls_w = [weights[i % copies] for i in range(2 if smoke else CALLS)]
    x = torch.randn(m, k, generator=gen, device=device, dtype=torch.bfloat16)
    outs = [torch.empty(m, n, device=device, dtype=torch.bfloat16) for _ in range(2)]
    moved = nbytes + (m * k + m * n) * 2
    base = {"shape": name, "swiglu": swiglu, "M": m, "N": n, "K": k, "weight_mb": nbytes / 1e6}
    rows, ok = [], True

    def row(label: str, seconds: float, failure: str | None) -> dict[str, Any]:
        gbs = moved / seconds / 1e9
        return {**base, "kernel": label, "us": seconds * 1e6, "gbs": gbs, "of_copy": gbs * 1e9 / copy_bw,
                "ok": failure is None, "failure": failure}

    ref = _reference(x, weights[0], swiglu)
    if swiglu:
        failure = _check(_torch_swiglu(x, weights[0]), ref, k, True)
        t = graph_time([lambda w=w: _torch_swiglu(x, w) for w in calls_w], device)
        label = "torch F.linear + F.silu * up"
    else:
        failure = _check(F.linear(x, weights[0]), ref, k, False)
        t = graph_time([lambda w=w: F.linear(x, w) for w in calls_w], device)
        label = "cuBLAS F.linear"
    ok &= failure is None
    rows.append(row(label, t, failure))
    for label, v in _candidates(m, swiglu, smoke):
        fn = (_swiglu_default if swiglu else _gemm_default) if v is None else _variant_call(v, swiglu)
        try:
            outs[0].fill_(float("nan"))
            failure = _check(fn(x, weights[0], outs[0]), ref, k, swiglu)
            t = graph_time([lambda w=w, o=outs[i % 2], fn=fn: fn(x, w, o) for i, w in enumerate(calls_w)], device)
        except Exception as err:  # a variant that does not compile or launch here: reported, never a winner
            failure, t = f"{type(err).__name__}: {err}"[:200], math.inf
        if v is None:
            ok &= failure is None
        rows.append({**row(label, t, failure), "variant": None if v is None else list(v)})
    return rows, ok


def winners(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per `_gemv.TABLE` key (row class, N, K, swiglu): the variant of least summed time over the class's M values
    among those correct at all of them, with the default's and the baseline's sums; `keep` where it beats the
    default by 2% or more."""
    from infiniops_triton._gemv import Variant, row_class

    groups: dict[tuple[int, int, int, bool], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((row_class(r["M"]), r["N"], r["K"], r["swiglu"]), []).append(r)
    found = []
    for key, group in groups.items():
        ms = sorted({r["M"] for r in group})
        sums: dict[str, float] = {}
        bad: set[str] = set()
        variants: dict[str, Any] = {}
        for r in group:
            sums[r["kernel"]] = sums.get(r["kernel"], 0.0) + r["us"]
            if not r["ok"]:
                bad.add(r["kernel"])
            if r.get("variant") is not None:
                variants[r["kernel"]] = r["variant"]
        base = next(r["kernel"] for r in group if r.get("variant") is None and r["kernel"] != "default")
        good = [label for label in variants if label not in bad and math.isfinite(sums[label])]
        if not good:
            continue
        best = min(good, key=lambda label: sums[label])
        found.append({"rows": key[0], "n": key[1], "k": key[2], "swiglu": key[3], "M": ms,
                      "shape": group[0]["shape"], "variant": variants[best], "label": repr(Variant(*variants[best])),
                      "best_us": sums[best] / len(ms), "default_us": sums["default"] / len(ms),
                      "baseline_us": sums[base] / len(ms), "keep": sums[best] <= 0.98 * sums["default"]})
    return found


def _table(rows: list[dict[str, Any]], keys: list[str]) -> str:
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per cell: the baseline, the default and the best variant, with the best's bandwidth."""
    cells: dict[tuple[str, bool, int], list[dict[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["shape"], r["swiglu"], r["M"]), []).append(r)
    out = []
    for (shape, swiglu, m), group in cells.items():
        base, default = group[0], next(r for r in group if r["kernel"] == "default")
        good = [r for r in group if r.get("variant") is not None and r["ok"]]
        best = min(good, key=lambda r: r["us"]) if good else default
        failed = sum(1 for r in group if not r["ok"])
        out.append({"shape": shape + (" swiglu" if swiglu else ""), "M": m, "weight MB": base["weight_mb"],
                    "baseline us": base["us"], "default us": default["us"], "best us": best["us"],
                    "best of copy": best["of_copy"], "best vs baseline": base["us"] / best["us"],
                    "best vs default": default["us"] / best["us"], "failed": failed, "best": best["kernel"]})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU under the interpreter")
    parser.add_argument("--jobs", type=int, default=12, help="compile worker processes (0: compile in place)")
    parser.add_argument("--rows", default=None, help="comma-separated M values (default 1,8,16,32,64)")
    parser.add_argument("--only", action="append", help="only the shapes whose name contains this (repeatable)")
    parser.add_argument("--emit", type=Path, metavar="FILE", help="write the kept winners as an _gemv.TABLE JSON")
    json_option(parser)
    args = parser.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("gpu_sweep_gemv.py needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("INFINIOPS_TRITON_INTERPRET_CPU", "1")
        ops.reload()
    from infiniops_triton import _gemv

    _gemv.TABLE.clear()  # the default is the code's, not an INFINIOPS_GEMV_TABLE file's
    device = torch.device("cpu" if args.smoke else "cuda")
    rows_m = tuple(int(v) for v in args.rows.split(",")) if args.rows else ROWS
    cells = [c for c in _cells(args.smoke, rows_m) if not args.only or any(s in c[0] for s in args.only)]
    started = time.perf_counter()
    copy_bw = 1.0 if args.smoke else copy_bandwidth_gbs(str(device), fill=True) * 1e9
    print(f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}; torch {torch.__version__}; "
          f"copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write); {len(cells)} cells", flush=True)
    warm_up(cells, args.jobs, args.smoke)
    rows, ok = [], True
    for cell in cells:
        got, good = bench_cell(cell, device, args.smoke, copy_bw)
        rows += got
        ok &= good
        best = min((r for r in got if r.get("variant") is not None and r["ok"]), key=lambda r: r["us"],
                   default=None)
        print(f"{cell[0]}{' swiglu' if cell[4] else ''} M {cell[1]}: baseline {got[0]['us']:.2f} us, default "
              f"{got[1]['us']:.2f}, best {best['us'] if best else math.nan:.2f} ({best['kernel'] if best else '-'}); "
              f"{sum(not r['ok'] for r in got)} failed  [{time.perf_counter() - started:.0f} s]", flush=True)
    for r in rows:
        if not r["ok"]:
            print(f"FAILED {r['shape']} M {r['M']} {r['kernel']}: {r['failure']}")
    print("\n### Per cell (baseline: cuBLAS F.linear, or torch's F.linear + SiLU-and-multiply for swiglu)\n")
    print(_table(summary(rows), ["shape", "M", "weight MB", "baseline us", "default us", "best us", "best of copy",
                                 "best vs baseline", "best vs default", "failed", "best"]))
    found = winners(rows)
    print("\n### Winners per _gemv.TABLE key (mean us over the class's M values)\n")
    print(_table(found, ["shape", "rows", "n", "k", "swiglu", "M", "baseline_us", "default_us", "best_us", "keep",
                         "label"]))
    kept = [w for w in found if w["keep"]]
    print("\n# _gemv.TABLE entries (paste into providers/triton/infiniops_triton/_gemv.py after TABLE's definition):")
    for w in kept:
        print(f"TABLE[({w['rows']}, {w['n']}, {w['k']}, {w['swiglu']})] = {w['label']}")
    if args.emit:
        args.emit.write_text(json.dumps([{k: w[k] for k in ("rows", "n", "k", "swiglu", "variant")} for w in kept],
                                        indent=1))
        _gemv.load_table(str(args.emit))  # the file loads as the kernel module will load it
        print(f"wrote {len(kept)} entries to {args.emit} (INFINIOPS_GEMV_TABLE={args.emit} loads them)")
    if args.json:
        env = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
               "date": time.strftime("%Y-%m-%d"), "copy_bandwidth": copy_bw}
        args.json.write_text(json.dumps([{**r, **env} for r in rows], indent=1, default=str))
    print(f"\ntotal {time.perf_counter() - started:.0f} s; defaults and baselines "
          f"{'meet' if ok else 'FAIL'} the bf16 rule", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

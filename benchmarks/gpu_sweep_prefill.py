"""Sweep of the Triton varlen prefill attention's launch settings on the H200 (issue 26), in under 4 min.

    python3 -m pip install -q --no-deps --no-build-isolation -e . -e providers/torch -e providers/triton
    python3 benchmarks/gpu_sweep_prefill.py [--json FILE] [--case NAME ...]   # one table per case, best marked *
    python3 benchmarks/gpu_sweep_prefill.py --smoke   # the CPU under TRITON_INTERPRET=1, tiny sizes, no timing

Each case (bf16, 4 sequences x 4096 tokens, 32 query heads, 32 or 8 kv heads, D 64 or 128, causal or not): the
Triton ``flash_attn_varlen`` with each of `VARIANTS` (a ``config`` of the launcher:
`infiniops_triton.flash_attn.PREFILL_KEYS`; ``defaults`` is the launcher as committed, its `PREFILL_DEFAULTS`
table; every other variant is that table's only row while it runs, so the public call takes it too) against
``F.scaled_dot_product_attention`` on the padded batch ``[B, H, S, D]`` (views of the same packed tensors, the
same bytes; GQA through ``enable_gqa``):

1. check: the output against SDPA in float64, the bf16 ``flash_attn_varlen`` rule of
   infiniops_py/testing/tolerances.py (the bf16 SDPA as the low-precision run), out poisoned first; PASS/FAIL
   (a variant that fails to compile or run is a FAIL line, the sweep goes on);
2. time: graph replay of one call of ours (the implementation, the calling convention) against graph replay of
   one SDPA call, per replay; TFLOP/s with a causal mask counting half; ratio = SDPA us / ours us; beside it the
   eager public call (``infiniops_py.flash_attn_varlen`` under ``use("triton")``, host checks included) against
   eager SDPA, both the median of CUDA-event timings.

The last lines give each case's fastest correct variant as a `PREFILL_DEFAULTS` row to copy into the table.
Exit status 1 when a variant failed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from _common import json_option
from gpu_decode import graph_time

import infiniops_py as ops
from infiniops_py.testing.compare import compare
from infiniops_py.testing.tolerances import tolerance

CASES = {  # name: (batch, seqlen, Hq, Hkv, D, causal)
    "D 128 causal": (4, 4096, 32, 32, 128, True), "D 64 causal": (4, 4096, 32, 32, 64, True),
    "D 128 full": (4, 4096, 32, 32, 128, False), "D 64 full": (4, 4096, 32, 32, 64, False),
    "D 128 causal GQA 32/8": (4, 4096, 32, 8, 128, True), "D 64 causal GQA 32/8": (4, 4096, 32, 8, 64, True),
    "D 128 full GQA 32/8": (4, 4096, 32, 8, 128, False), "D 64 full GQA 32/8": (4, 4096, 32, 8, 64, False),
}
SMOKE_CASES = {"tiny D 64 causal GQA": (2, 40, 4, 2, 64, True), "tiny D 32 full": (2, 24, 2, 2, 32, False)}
EAGER_RUNS = 10


def _tile(bm: int, bn: int, warps: int, stages: int, *, lazy: bool = False) -> dict[str, Any]:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages, "LAZY": lazy, "USE_TMA": True}


# (Triton's warp-specialized loop was swept in session 9 and dropped: NaNs on the H200, and not faster.)
VARIANTS: dict[str, dict[str, Any] | None] = {
    "defaults": None,  # PREFILL_DEFAULTS as committed
    "autotuned": {},  # the autotuner's pick among its configurations (main before this sweep)
    # the split causal loop (unmasked blocks, then the diagonal); 8 warps on 128 x 128 score tiles
    "128/128 8w 2s": _tile(128, 128, 8, 2),
    "128/128 8w 2s lazy": _tile(128, 128, 8, 2, lazy=True),
    "128/64 8w 3s lazy": _tile(128, 64, 8, 3, lazy=True),  # the autotuner's first configuration
    "128/64 8w 3s": _tile(128, 64, 8, 3),
    # one warpgroup on 128 rows, or 64-row blocks (more programs per SM)
    "128/64 4w 3s lazy": _tile(128, 64, 4, 3, lazy=True),
    "64/64 4w 3s lazy": _tile(64, 64, 4, 3, lazy=True),
    "64/128 4w 2s lazy": _tile(64, 128, 4, 2, lazy=True),
}
HEAD_DIMS = {"128/64 4w 3s lazy": (64,)}  # variants that run at these head dims only (D 128: 128 x 128 fp32 spills)


def runs_at(label: str, d: int) -> bool:
    """Whether variant `label` runs at head dim `d` (`HEAD_DIMS`; the others everywhere)."""
    return d in HEAD_DIMS.get(label, (d,))


def _sdpa(c: dict[str, Any], dtype: torch.dtype | None = None, batch: slice = slice(None)) -> torch.Tensor:
    """SDPA on the padded batch ``[B, H, S, D]`` (views of the packed rows), output in the packed layout."""
    b, s = c["batch"], c["seqlen"]
    q, k, v = (c[n].view(b, s, *c[n].shape[1:])[batch].transpose(1, 2) for n in ("q", "k", "v"))
    if dtype is not None:
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=c["causal"], scale=c["scale"], enable_gqa=True)
    return out.transpose(1, 2).reshape(-1, *c["q"].shape[1:])


def _ours(c: dict[str, Any], out: torch.Tensor, config: dict[str, Any] | None) -> torch.Tensor:
    from infiniops_triton import flash_attn as tfa

    return tfa.flash_attn_varlen(c["q"], c["k"], c["v"], c["cu"], c["cu"], c["seqlen"], c["seqlen"], c["scale"],
                                 c["causal"], (-1, -1), 0.0, None, out, config=config)


def _public(c: dict[str, Any]) -> torch.Tensor:
    with ops.use("triton"):
        return ops.flash_attn_varlen(c["q"], c["k"], c["v"], c["cu"], c["cu"], c["seqlen"], c["seqlen"],
                                     softmax_scale=c["scale"], causal=c["causal"])


class _Settings:
    """Within: `PREFILL_DEFAULTS` holds only the variant's settings (None: the table as committed)."""

    def __init__(self, config: dict[str, Any] | None) -> None:
        self.config = config

    def __enter__(self) -> None:
        from infiniops_triton import flash_attn as tfa

        self.saved = list(tfa.PREFILL_DEFAULTS)
        if self.config is not None:
            tfa.PREFILL_DEFAULTS[:] = [(1 << 30, None, dict(self.config))]

    def __exit__(self, *exc: object) -> None:
        from infiniops_triton import flash_attn as tfa

        tfa.PREFILL_DEFAULTS[:] = self.saved


def eager_time(fn: Callable[[], Any], runs: int = EAGER_RUNS) -> float:
    """Seconds per call, the median of `runs` CUDA-event timings of single eager calls (after one warm-up)."""
    fn()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]


def flops(batch: int, seqlen: int, hq: int, d: int, causal: bool) -> float:
    """Two matmuls of 2·S²·D flops per head; a causal mask halves them (the usual convention)."""
    total = 4.0 * batch * hq * seqlen * seqlen * d
    return total / 2 if causal else total


def prepare_case(shape: tuple[int, int, int, int, int, bool], device: torch.device, smoke: bool) -> dict[str, Any]:
    """The case's packed q/k/v, the float64 and bf16 SDPA outputs, SDPA's graph-replay and eager times (nan
    under --smoke)."""
    batch, seqlen, hq, hkv, d, causal = shape
    gen = torch.Generator(device=device).manual_seed(batch * seqlen + hkv * d + causal)
    c: dict[str, Any] = {"batch": batch, "seqlen": seqlen, "causal": causal, "scale": d ** -0.5,
                         "cu": torch.arange(0, (batch + 1) * seqlen, seqlen, dtype=torch.int32, device=device)}
    for name, heads in (("q", hq), ("k", hkv), ("v", hkv)):
        c[name] = torch.randn(batch * seqlen, heads, d, generator=gen, device=device).to(torch.bfloat16)
    # float64 one sequence at a time: the [S, S] float64 scores of all heads of the batch stay a few GB
    c["ref"] = torch.cat([_sdpa(c, torch.float64, slice(i, i + 1)) for i in range(batch)])
    c["low"] = _sdpa(c)
    c["out"] = torch.empty_like(c["q"])
    c["flops"] = flops(batch, seqlen, hq, d, causal)
    c["sdpa_us"] = math.nan if smoke else 1e6 * graph_time([lambda: _sdpa(c)], device)
    c["sdpa_eager_us"] = math.nan if smoke else 1e6 * eager_time(lambda: _sdpa(c))
    return c


def _measure(c: dict[str, Any], config: dict[str, Any] | None, device: torch.device, smoke: bool) -> dict[str, Any]:
    """check, worst, note, us (graph replay) and eager_us of one variant; a variant that fails to compile or run
    is a FAIL, the sweep goes on."""
    tol = tolerance("flash_attn_varlen", "bfloat16")
    try:
        with _Settings(config):
            fixed = None if config is None or not config else config  # {}: the autotuner, as the table's {} row
            c["out"].fill_(float("nan"))
            _ours(c, c["out"], fixed)
            worst, failure = compare("result", c["out"], c["ref"], tol, low=c["low"])
            public = _public(c)
            if failure is None:
                _, failure = compare("public call", public, c["ref"], tol, low=c["low"])
            us = math.nan if smoke else 1e6 * graph_time([lambda: _ours(c, c["out"], fixed)], device)
            eager_us = math.nan if smoke else 1e6 * eager_time(lambda: _public(c))
    except Exception as e:
        return {"check": "FAIL", "worst": math.inf, "us": math.nan, "eager_us": math.nan,
                "note": f"{type(e).__name__}: {e}"[:200]}
    return {"check": "PASS" if failure is None else "FAIL", "worst": worst, "us": us, "eager_us": eager_us,
            "note": failure or ""}


def run_variant(name: str, case: dict[str, Any], label: str, config: dict[str, Any] | None, device: torch.device,
                smoke: bool, skip: bool = False) -> dict[str, Any]:
    """One row: the variant `label` on the prepared case (a SKIP row when `skip`)."""
    row: dict[str, Any] = {"case": name, "variant": label, "config": config, "sdpa_us": case["sdpa_us"],
                           "sdpa_eager_us": case["sdpa_eager_us"]}
    if skip or not runs_at(label, case["q"].shape[-1]):
        row.update(check="SKIP", worst=math.nan, us=math.nan, eager_us=math.nan,
                   note="past --budget" if skip else "not at this head dim")
    else:
        row.update(_measure(case, config, device, smoke))
    row["tflops"] = case["flops"] / row["us"] / 1e6
    row["sdpa_tflops"] = case["flops"] / row["sdpa_us"] / 1e6
    row["ratio"] = row["sdpa_us"] / row["us"]
    row["eager_ratio"] = row["sdpa_eager_us"] / row["eager_us"]
    return row


def best_index(rows: list[dict[str, Any]]) -> int | None:
    """The fastest variant (graph replay) that passed its check (none under --smoke: nothing is timed)."""
    ok = [i for i, r in enumerate(rows) if r["check"] == "PASS" and math.isfinite(r["us"])]
    return min(ok, key=lambda i: rows[i]["us"]) if ok else None


def format_case(name: str, shape: tuple[int, int, int, int, int, bool], rows: list[dict[str, Any]]) -> str:
    best = best_index(rows)
    batch, seqlen, hq, hkv, d, causal = shape
    r0 = rows[0]
    lines = [f"\n### {name} ({batch} x {seqlen}, {hq}/{hkv} heads, D {d}, {'causal' if causal else 'no mask'}; "
             f"SDPA graph {r0['sdpa_us']:.0f} us = {r0['sdpa_tflops']:.0f} TFLOP/s, eager {r0['sdpa_eager_us']:.0f} us)"
             "\n",
             "| | variant | check | max err | graph us | TFLOP/s | SDPA/ours graph | eager us | SDPA/ours eager |",
             "|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows):
        note = f" {r['note'][:90]}" if r["note"] else ""
        lines.append(f"| {'*' if i == best else ''} | {r['variant']} | {r['check']}{note} | {r['worst']:.3g} | "
                     f"{r['us']:.0f} | {r['tflops']:.0f} | {r['ratio']:.2f} | {r['eager_us']:.0f} | "
                     f"{r['eager_ratio']:.2f} |")
    return "\n".join(lines)


def winners(results: dict[str, list[dict[str, Any]]], cases: dict[str, tuple[int, int, int, int, int, bool]]) -> str:
    """Each case's fastest correct variant, as a `PREFILL_DEFAULTS` row (largest head dim, causal, settings)."""
    lines = ["\n### winners (PREFILL_DEFAULTS rows: (largest head dim, causal, settings); order rows by head dim)\n"]
    for name, rows in results.items():
        d, causal = cases[name][4], cases[name][5]
        best = best_index(rows)
        if best is None:
            lines.append(f"{name}: no variant timed and correct")
            continue
        r = rows[best]
        settings = "the committed defaults" if r["config"] is None else f"({d}, {causal}, {r['config']})"
        lines.append(f"{name}: {r['variant']} -> {settings} ({r['us']:.0f} us, {r['tflops']:.0f} TFLOP/s, "
                     f"{r['ratio']:.2f}x SDPA graph, {r['eager_ratio']:.2f}x eager)")
    table = proposed_table(results, cases)
    if table:
        lines += ["", "PREFILL_DEFAULTS = [  # the H200 sweep's winners without GQA (benchmarks/RESULTS.md)",
                  *(f"    {row}," for row in table), "]"]
    return "\n".join(lines)


def proposed_table(results: dict[str, list[dict[str, Any]]],
                   cases: dict[str, tuple[int, int, int, int, int, bool]]) -> list[tuple[int, Any, dict[str, Any]]]:
    """`PREFILL_DEFAULTS` rows from the winners of the cases with as many kv heads as query heads: one row per
    (head dim, causal), by head dim, {} where the autotuner won; the last row autotunes the larger head dims."""
    rows = {}
    for name, found in results.items():
        _, _, hq, hkv, d, causal = cases[name]
        best = best_index(found)
        if hq == hkv and best is not None:
            rows[(d, causal)] = dict(found[best]["config"] or {})
    if not rows:
        return []
    return [*((d, causal, rows[(d, causal)]) for d, causal in sorted(rows)), (256, None, {})]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (no timing): the script itself")
    parser.add_argument("--case", action="append", help="run only these cases (names of CASES)")
    parser.add_argument("--variant", action="append", help="run only these variants (names of VARIANTS)")
    parser.add_argument("--budget", type=float, default=200.0, metavar="S",
                        help="seconds after which the variants left are skipped (SKIP rows), 200 by default")
    json_option(parser)
    args = parser.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("gpu_sweep_prefill.py needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    if args.smoke:  # the Triton kernels on the CPU, as CI runs them
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("INFINIOPS_TRITON_INTERPRET_CPU", "1")
        ops.reload()
    device = torch.device("cpu" if args.smoke else "cuda")
    pool = SMOKE_CASES if args.smoke else CASES
    cases = {n: pool[n] for n in args.case} if args.case else pool
    variants = {n: VARIANTS[n] for n in args.variant} if args.variant else VARIANTS
    print(f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}; torch {torch.__version__}; "
          f"{len(variants)} variants x {len(cases)} cases", flush=True)
    began = time.perf_counter()
    prepared = {name: prepare_case(shape, device, args.smoke) for name, shape in cases.items()}
    print(f"cases ready ({time.perf_counter() - began:.0f} s); SDPA graph us: "
          + ", ".join(f"{n} {c['sdpa_us']:.0f}" for n, c in prepared.items()), flush=True)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in cases}
    for label, config in variants.items():  # variant-major: past --budget the same variants are skipped everywhere
        skip = time.perf_counter() - began > args.budget
        for name in cases:
            results[name].append(run_variant(name, prepared[name], label, config, device, args.smoke, skip))
        line = "  ".join(f"{results[n][-1]['check']} {results[n][-1]['us']:.0f} us {results[n][-1]['ratio']:.2f}x"
                         for n in cases)
        print(f"[{time.perf_counter() - began:4.0f} s] {label}: {line}", flush=True)  # progress, case order
    ok = all(r["check"] != "FAIL" for rows in results.values() for r in rows)
    for name, shape in cases.items():
        print(format_case(name, shape, results[name]), flush=True)
    print(winners(results, cases))
    skipped = sum(r["note"] == "past --budget" for rows in results.values() for r in rows)
    print(f"\nwall {time.perf_counter() - began:.0f} s; outputs {'no FAIL' if ok else 'some FAIL'}; {skipped} skipped "
          "past --budget", flush=True)
    if args.json:
        env = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
               "date": time.strftime("%Y-%m-%d")}
        args.json.write_text(json.dumps([{**r, **env} for rows in results.values() for r in rows], indent=1,
                                        default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Helpers shared by the GPU benchmark scripts (gpu_dense, gpu_attention, gpu_ssm, ops, gpu_infinilm, gpu_mamba2).

The scripts run as ``python3 benchmarks/<script>.py`` (this folder is then on ``sys.path``), are imported by
benchmarks/ops.py after it puts this folder on ``sys.path``, and are loaded by file path in the tests; each
script puts this folder on ``sys.path`` itself before importing this module.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

import infiniops_py

Timer = Callable[[Callable[[], Any]], float]  # milliseconds per call of a no-argument function
Row = dict[str, Any]  # one line of a family's table: ``kind`` "check" or "perf"


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
             roofline: float, target: str, ok: bool, note: str) -> Row:
    """One timing line: Triton's and the torch provider's rates, a baseline's, the roofline fraction, the target."""
    return {"kind": "perf", "family": family, "case": case, "metric": metric, "triton": triton_v, "torch": torch_v,
            "baseline": baseline, "baseline_value": baseline_v, "vs_torch": triton_v / torch_v if torch_v else math.nan,
            "roofline": roofline, "target": target, "status": "PASS" if ok else "MISS", "note": note}


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
         header: int | None = None, wall_time: bool = False) -> int:
    """A family script's entry point: needs CUDA, runs, prints the table (after a ``case``/``status`` header of
    width `header`, and the total wall time when asked); 0 when every line passed."""
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
    token, after a 4-token warm-up; `min_new_tokens`: also ask for at least that many tokens."""
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
    return ids.shape[0] * (output_len - 1) / (full - first)


def p50_ms(seconds: Sequence[float]) -> float:
    """The median (upper middle) of step times in seconds, in milliseconds."""
    return sorted(seconds)[len(seconds) // 2] * 1e3

"""GPU benchmark of the Triton selective scan (Mamba-2 SSD) and state update against the targets below.

    python benchmarks/gpu_ssm.py            # correctness, then timings, then the table (< 3 min on the H200)

1. Correctness at realistic sizes, fp16, bf16 and fp32: the Triton provider through the public functions
   against the float64 reference (run on the same GPU) with the tolerance table; the scan's output and
   final states, the update's output and state. One PASS/FAIL line per case.
2. Timings (``triton.testing.do_bench``, median), measured in this run: the copy bandwidth (a 2 GiB
   device-to-device copy, read + write bytes), bf16 ``torch.matmul`` TFLOP/s at 8192^3, then at the
   Mamba-2-130m layer shape (H=24, P=64, N=128, G=1, chunk 256; bf16 inputs, fp32 states):
   - prefill (D, dt_bias, softplus, final states) at 8 x 2048, 1 x 16384 and 1 x 2048 tokens: tokens/s of
     Triton and of the torch provider; targets >= 25M tokens/s (the first two), < 0.3 ms (the third),
     >= 30x the torch provider at 8 x 2048. The roofline column is the time the larger of the minimal
     bytes (x, dt, B, C read; y and final states written) at the copy bandwidth and the SSD flops at the
     matmul rate would take, over the time measured;
   - ``selective_state_update``, batch 64 gathered from 128 slots (D, dt_bias, softplus): state bytes read
     and written per second; target >= 70% of the copy bandwidth.
   The baseline column holds state-spaces/mamba's figures on the H200 (`MAMBA`: quoted, not measured here).
   Where the time goes, in each line's note: every Triton launch of the prefill timed alone, the whole
   call replayed as a CUDA graph (GPU time only), and the host time per eager call (launch overhead);
   for the state update, a sweep of its tile height and warp count.

`run(results)` appends one dict per line of the table (``kind`` "check" or "perf"), for benchmarks/ops.py.
Timed calls go straight to the resolved implementations (the operator's calling convention) with index
checks off, so host-side checks and synchronizations stay out of the measurement.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

import infiniops_py
from infiniops_py.operators.selective_scan import selective_scan, selective_state_update
from infiniops_py.testing.compare import compare
from infiniops_py.testing.tolerances import tolerance

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)  # benchmarks/_common.py, also when a test loads this file by its path
from _common import (
    Timer,
    bench_main,
    captured,
    check_row,
    copy_bandwidth_gbs,
    format_rows,
    matmul_tflops,
    median_ms,
    perf_row,
    resolved_call,
    run_perf,
)
from _common import randn as _randn

FAMILY = "ssm"
TOKENS_TARGET = 25e6  # tokens/s at 8 x 2048 and 1 x 16384
SHORT_TARGET_MS = 0.3  # 1 x 2048
VS_TORCH_TARGET = 30.0  # at 8 x 2048
UPDATE_TARGET = 0.70  # x copy bandwidth
MAMBA = {"8x2048": 26e6, "1x16384": 26e6, "1x2048": 2048 / 0.95e-3, "update": 640.0}  # mamba_ssm on the H200, quoted


class Layer(NamedTuple):
    """One Mamba-2 layer's scan shape."""

    heads: int = 24
    head_dim: int = 64
    d_state: int = 128
    groups: int = 1
    chunk: int = 256


MAMBA2_130M = Layer()
TINY = Layer(heads=2, head_dim=16, d_state=16, groups=1, chunk=16)  # for a CPU run under the interpreter


# --- inputs ----------------------------------------------------------------------------------------


def scan_case(batch: int, length: int, layer: Layer, dtype: torch.dtype, device: str, *, z: bool = False,
              d_per_channel: bool = False, initial: bool = False, final: bool = True, runs: int = 0,
              dt_limit: tuple[float, float] = (0.0, math.inf), seed: int = 0) -> tuple[tuple[torch.Tensor, ...],
                                                                                        dict[str, Any]]:
    """Positional and keyword arguments of `selective_scan`, drawn like a Mamba-2 layer's (dt from an
    inverse-softplus bias, A = -exp(.)); `runs` > 0 packs that many sequences per row through seq_idx."""
    gen = torch.Generator(device=device).manual_seed(seed)
    h, p, n, g = layer.heads, layer.head_dim, layer.d_state, layer.groups
    x = _randn(batch, length, h, p, dtype=dtype, device=device, gen=gen)
    dt = _randn(batch, length, h, dtype=dtype, device=device, gen=gen, scale=0.5)
    A = -torch.exp(_randn(h, dtype=torch.float32, device=device, gen=gen, scale=0.5))
    B = _randn(batch, length, g, n, dtype=dtype, device=device, gen=gen)
    C = _randn(batch, length, g, n, dtype=dtype, device=device, gen=gen)
    steps = 1e-3 + 0.099 * torch.rand(h, generator=gen, device=device)
    kwargs: dict[str, Any] = {
        "D": _randn(*((h, p) if d_per_channel else (h,)), dtype=torch.float32, device=device, gen=gen),
        "dt_bias": torch.log(torch.expm1(steps)), "dt_softplus": True, "dt_limit": dt_limit,
        "chunk_size": layer.chunk, "return_final_states": final,
    }
    if z:
        kwargs["z"] = _randn(batch, length, h, p, dtype=dtype, device=device, gen=gen)
    if initial:
        kwargs["initial_states"] = _randn(batch, h, p, n, dtype=torch.float32, device=device, gen=gen)
    if runs:
        cuts = torch.sort(torch.randperm(length - 1, generator=gen, device=device)[:runs - 1] + 1).values
        seq_idx = torch.zeros(batch, length, dtype=torch.int32, device=device)
        for cut in cuts.tolist():
            seq_idx[:, cut:] += 1
        kwargs["seq_idx"] = seq_idx
    return (x, dt, A, B, C), kwargs


def update_case(batch: int, slots: int, layer: Layer, dtype: torch.dtype, device: str, *, z: bool = False,
                padding: int = 0, seed: int = 0) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
    """Arguments of `selective_state_update`: fp32 states, rows gathered from `slots` through a shuffled
    index, the first `padding` rows padded (-1)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    h, p, n, g = layer.heads, layer.head_dim, layer.d_state, layer.groups
    state = _randn(slots, h, p, n, dtype=torch.float32, device=device, gen=gen)
    x = _randn(batch, h, p, dtype=dtype, device=device, gen=gen)
    dt = _randn(batch, h, dtype=dtype, device=device, gen=gen, scale=0.5)
    A = -torch.exp(_randn(h, dtype=torch.float32, device=device, gen=gen, scale=0.5))
    B = _randn(batch, g, n, dtype=dtype, device=device, gen=gen)
    C = _randn(batch, g, n, dtype=dtype, device=device, gen=gen)
    index = torch.randperm(slots, generator=gen, device=device)[:batch]
    index[:padding] = -1
    kwargs: dict[str, Any] = {
        "D": _randn(h, dtype=torch.float32, device=device, gen=gen),
        "dt_bias": torch.log(torch.expm1(1e-3 + 0.099 * torch.rand(h, generator=gen, device=device))),
        "dt_softplus": True, "state_batch_indices": index,
    }
    if z:
        kwargs["z"] = _randn(batch, h, p, dtype=dtype, device=device, gen=gen)
    return (state, x, dt, A, B, C), kwargs


# --- correctness -----------------------------------------------------------------------------------


def _float64(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.double()
    return value.clone() if isinstance(value, torch.Tensor) else value


def _compare_all(op: str, dtype: torch.dtype, pairs: list[tuple[str, torch.Tensor, torch.Tensor]]) -> tuple[float,
                                                                                                          str]:
    worst_all, message = 0.0, ""
    for label, got, ref in pairs:
        worst, failure = compare(label, got, ref, tolerance(op, str(dtype).removeprefix("torch.")))
        worst_all = max(worst_all, worst)
        if failure is not None and not message:
            message = failure
    return worst_all, message


def check_scan(args: tuple[torch.Tensor, ...], kwargs: dict[str, Any]) -> tuple[bool, float, str]:
    """Triton vs the float64 reference: the output and, when asked for, the final states."""
    with infiniops_py.use("triton"):
        got = selective_scan(*args, **kwargs)
    with infiniops_py.use("reference"):
        ref = selective_scan(*map(_float64, args), **{k: _float64(v) for k, v in kwargs.items()})
    got, ref = (got, ref) if isinstance(got, tuple) else ((got,), (ref,))
    names = ("out", "final_states")
    worst, message = _compare_all("selective_scan", args[0].dtype, list(zip(names, got, ref)))
    return not message, worst, message


def check_update(args: tuple[torch.Tensor, ...], kwargs: dict[str, Any]) -> tuple[bool, float, str]:
    """Triton vs the float64 reference: the output and the whole state tensor after the step."""
    state = args[0].clone()
    with infiniops_py.use("triton"):
        got = selective_state_update(state, *args[1:], **kwargs)
    ref_state = args[0].double()
    with infiniops_py.use("reference"):
        ref = selective_state_update(ref_state, *map(_float64, args[1:]), **{k: _float64(v) for k, v in kwargs.items()})
    pairs = [("out", got, ref), ("state", state, ref_state)]
    worst, message = _compare_all("selective_state_update", args[1].dtype, pairs)
    return not message, worst, message


def correctness_cases(dtype: torch.dtype, device: str, small: bool = False) -> list[tuple[str, Callable[[], Any]]]:
    """(name, check) pairs at realistic sizes (tiny ones when `small`, for a CPU run).

    Few distinct kernel specializations per dtype (each compiles and autotunes its configs once), and
    fp32 only at the Mamba-2 layer shape, to keep the run short.
    """
    layer = TINY if small else MAMBA2_130M
    wide = Layer(4, 16, 16, 2, 16) if small else Layer(heads=32, head_dim=32, d_state=64, groups=8, chunk=64)
    rows = 4 if small else 64

    def size(n: int) -> int:
        return max(3, n // 64) if small else n

    cases = [
        (f"scan 2x{size(1100)} H{layer.heads} P{layer.head_dim} N{layer.d_state} D z init final",
         lambda: check_scan(*scan_case(2, size(1100), layer, dtype, device, z=True, initial=True, seed=1))),
        (f"update B{rows} of {2 * rows} slots, 3 padded, z",
         lambda: check_update(*update_case(rows, 2 * rows, layer, dtype, device, z=True, padding=3, seed=5))),
    ]
    if dtype == torch.float32:
        return cases
    return [
        *cases,
        (f"scan 1x{size(3000)} 4 seq_idx runs, D[H,P], dt_limit",
         lambda: check_scan(*scan_case(1, size(3000), layer, dtype, device, runs=4, d_per_channel=True,
                                       dt_limit=(1e-3, 0.05), seed=2))),
        (f"scan 3x{size(333)} H{wide.heads} P{wide.head_dim} N{wide.d_state} G{wide.groups} chunk{wide.chunk} z init",
         lambda: check_scan(*scan_case(3, size(333), wide, dtype, device, z=True, initial=True, seed=3))),
        (f"update B{rows // 2} H{wide.heads} P{wide.head_dim} N{wide.d_state} G{wide.groups}",
         lambda: check_update(*update_case(rows // 2, rows // 2, wide, dtype, device, seed=6))),
    ]


def correctness(device: str, dtypes: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32),
                small: bool = False) -> list[dict[str, Any]]:
    rows = []
    for dtype in dtypes:
        for name, check in correctness_cases(dtype, device, small):
            rows.append(check_row(FAMILY, name, dtype, check))
    return rows


# --- timings ---------------------------------------------------------------------------------------


def scan_bytes(batch: int, length: int, layer: Layer, elem: int = 2) -> int:
    """The least a prefill moves: x, dt, B, C read, y written (x's dtype), final states written (fp32)."""
    tokens = batch * length
    per_token = 2 * layer.heads * layer.head_dim + layer.heads + 2 * layer.groups * layer.d_state
    return tokens * per_token * elem + 4 * batch * layer.heads * layer.head_dim * layer.d_state


def scan_flops(batch: int, length: int, layer: Layer) -> float:
    """The chunked SSD's flops: per chunk of T tokens, C B^T per group (causal half) and, per head, the
    causal (C B^T) x product, the chunk's end state and the entering state's output term."""
    t, p, n = layer.chunk, layer.head_dim, layer.d_state
    chunks = batch * math.ceil(length / t)
    per_group = t * t * n  # 2 T^2 N, halved
    per_head = t * t * p + 2 * (2 * t * p * n)
    return float(chunks * (layer.groups * per_group + layer.heads * per_head))


def update_bytes(batch: int, layer: Layer) -> int:
    """fp32 state bytes one decode step reads and writes."""
    return 2 * batch * layer.heads * layer.head_dim * layer.d_state * 4


def _scan_problem(args: tuple[torch.Tensor, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    x, B = args[0], args[3]
    return {"device_type": x.device.type, "dtype": str(x.dtype)[6:], "head_dim": x.shape[-1], "d_state": B.shape[-1],
            "n_groups": B.shape[2], "chunk_size": kwargs["chunk_size"], "has_D": "D" in kwargs, "has_z": "z" in kwargs,
            "has_dt_bias": "dt_bias" in kwargs, "dt_softplus": kwargs["dt_softplus"],
            "has_seq_idx": "seq_idx" in kwargs, "has_initial_states": "initial_states" in kwargs,
            "return_final_states": kwargs["return_final_states"]}


def _scan_convention(args: tuple[torch.Tensor, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The implementation calling convention's arguments, with fresh `out` and final-state buffers."""
    x, B = args[0], args[3]
    out = torch.empty_like(x)
    final = (torch.empty(x.shape[0], x.shape[2], x.shape[3], B.shape[-1], device=x.device, dtype=torch.float32)
             if kwargs["return_final_states"] else None)
    return (*args, kwargs.get("D"), kwargs.get("z"), kwargs.get("dt_bias"), kwargs["dt_softplus"],
            kwargs["dt_limit"], kwargs.get("initial_states"), kwargs.get("seq_idx"), kwargs["chunk_size"], out, final)


def scan_call(provider: str, args: tuple[torch.Tensor, ...], kwargs: dict[str, Any]) -> Callable[[], Any]:
    """A no-argument callable running `provider`'s selective_scan on the arguments (calling convention)."""
    with infiniops_py.use(provider):
        fn = infiniops_py.resolve("selective_scan", **_scan_problem(args, kwargs)).fn
    conv = _scan_convention(args, kwargs)
    return lambda: fn(*conv)


def stage_times(args: tuple[torch.Tensor, ...], kwargs: dict[str, Any], timer: Timer) -> dict[str, float]:
    """Milliseconds of each Triton launch of one prefill, timed alone (after one warm-up pass in order)."""
    from infiniops_triton.selective_scan import scan_stages

    stages = scan_stages(*_scan_convention(args, kwargs))
    for _, launch in stages:
        launch()
    return {name: timer(launch) for name, launch in stages}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def host_ms(fn: Callable[[], Any], device: str, calls: int = 50) -> float:
    """Host milliseconds per call of an already warmed-up `fn`: launches only (the device catches up after
    the clock stops)."""
    _sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    _sync(device)
    return elapsed / calls * 1e3


def graph_ms(fn: Callable[[], Any], timer: Timer) -> float:
    """Milliseconds per replay of `fn` captured in a CUDA graph: the device time without launch overhead."""
    with captured(fn) as graph:
        return timer(graph.replay)


def _attempt(what: str, measure: Callable[[], str]) -> str:
    """`measure()`'s text, or why it failed: an extra measurement never stops the benchmark."""
    try:
        return measure()
    except Exception as e:
        return f"{what} failed: {type(e).__name__}: {str(e)[:80]}"


def scan_breakdown(device: str, args: tuple[torch.Tensor, ...], kwargs: dict[str, Any], fn: Callable[[], Any],
                   timer: Timer, calls: int) -> str:
    """Where the prefill's time goes: each launch alone, the CUDA-graph replay, the host time per call."""
    parts = [_attempt("stages", lambda: " + ".join(f"{k} {v:.3f}" for k, v in stage_times(args, kwargs,
                                                                                            timer).items()))]
    parts.append(_attempt("host", lambda: f"host {host_ms(fn, device, calls):.3f} ms/call"))
    if device == "cuda":
        parts.append(_attempt("graph", lambda: f"graph replay {graph_ms(fn, timer):.3f} ms"))
    return "; ".join(parts)


def _update_convention(args: tuple[torch.Tensor, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The implementation calling convention's arguments, on a copy of the state and a fresh `out`."""
    return (args[0].clone(), *args[1:], kwargs.get("D"), kwargs.get("z"), kwargs.get("dt_bias"),
            kwargs["dt_softplus"], kwargs.get("state_batch_indices"), torch.empty_like(args[1]))


def update_call(provider: str, args: tuple[torch.Tensor, ...], kwargs: dict[str, Any]) -> Callable[[], Any]:
    """A no-argument callable running `provider`'s selective_state_update in place on a copy of the state."""
    x, B = args[1], args[4]
    problem = {"device_type": x.device.type, "dtype": str(x.dtype)[6:], "head_dim": x.shape[-1],
               "d_state": B.shape[-1], "n_groups": B.shape[1], "has_D": "D" in kwargs, "has_z": "z" in kwargs,
               "has_dt_bias": "dt_bias" in kwargs, "dt_softplus": kwargs["dt_softplus"],
               "has_indices": "state_batch_indices" in kwargs}
    return resolved_call(provider, "selective_state_update", problem, *_update_convention(args, kwargs))


UPDATE_SWEEP = ((16, 4), (32, 4), (64, 4), (64, 8), (32, 8))  # (BLOCK_P, num_warps) of the state update


def update_sweep(args: tuple[torch.Tensor, ...], kwargs: dict[str, Any], nbytes: int, timer: Timer) -> str:
    """GB/s of the Triton state update at each (BLOCK_P, num_warps) of `UPDATE_SWEEP`."""
    from infiniops_triton.state_update import launch

    conv = _update_convention(args, kwargs)
    rates = [f"{bp}x{nw}w {nbytes / timer(lambda bp=bp, nw=nw: launch(*conv, bp, nw)) / 1e6:.0f}"
             for bp, nw in UPDATE_SWEEP]
    return "sweep BLOCK_P x warps GB/s: " + ", ".join(rates)


def bench_scan(device: str, copy_gbs: float, gemm_tflops: float, batch: int, length: int, label: str, *,
               layer: Layer = MAMBA2_130M, timer: Timer = median_ms) -> dict[str, Any]:
    """Prefill at `batch` x `length`, bf16, against the target of the size `label` (a key of
    `MAMBA`): tokens/s, plus x torch for "8x2048", or the time for "1x2048"."""
    args, kwargs = scan_case(batch, length, layer, torch.bfloat16, device, seed=11)
    tokens = batch * length
    tri_fn = scan_call("triton", args, kwargs)
    tri_ms = timer(tri_fn)
    tor_ms = timer(scan_call("torch", args, kwargs))
    ideal_ms = max(scan_bytes(batch, length, layer) / copy_gbs / 1e6, scan_flops(batch, length, layer) / gemm_tflops
                   / 1e9)
    tri, tor = tokens / tri_ms / 1e3, tokens / tor_ms / 1e3  # M tokens/s
    notes = [f"{tri_ms:.3f} ms", f"{tor_ms / tri_ms:.1f}x torch"]
    if label == "1x2048":
        ok = tri_ms < SHORT_TARGET_MS
        target = f"< {SHORT_TARGET_MS} ms"
        notes.append("" if ok else f"over by {tri_ms - SHORT_TARGET_MS:.3f} ms")
    else:
        ok = tri * 1e6 >= TOKENS_TARGET
        target = f">= {TOKENS_TARGET / 1e6:.0f}M tok/s"
        notes.append("" if ok else f"short by {TOKENS_TARGET / 1e6 - tri:.1f}M tok/s")
        if label == "8x2048":
            vs = tor_ms / tri_ms
            ok = ok and vs >= VS_TORCH_TARGET
            target += f" and >= {VS_TORCH_TARGET:.0f}x torch"
            notes.append("" if vs >= VS_TORCH_TARGET else f"{VS_TORCH_TARGET - vs:.1f}x short of the torch ratio")
    notes.append(scan_breakdown(device, args, kwargs, tri_fn, timer, 50 if device == "cuda" else 1))
    case = (f"scan {batch}x{length} H{layer.heads} P{layer.head_dim} N{layer.d_state} G{layer.groups} "
            f"chunk{layer.chunk} bf16")
    return perf_row(FAMILY, case, "Mtok/s", tri, tor, "mamba_ssm", MAMBA[label] / 1e6, ideal_ms / tri_ms, target, ok,
                    ", ".join(n for n in notes if n), op="selective_scan", ms={"triton": tri_ms, "torch": tor_ms})


def bench_update(device: str, copy_gbs: float, *, batch: int = 64, slots: int = 128, layer: Layer = MAMBA2_130M,
                 timer: Timer = median_ms) -> dict[str, Any]:
    """One decode step, bf16 inputs and fp32 states, in state bytes read + written per second."""
    args, kwargs = update_case(batch, slots, layer, torch.bfloat16, device, seed=12)
    nbytes = update_bytes(batch, layer)
    tri_fn = update_call("triton", args, kwargs)
    ms = {"triton": timer(tri_fn), "torch": timer(update_call("torch", args, kwargs))}
    tri, tor = nbytes / ms["triton"] / 1e6, nbytes / ms["torch"] / 1e6
    frac = tri / copy_gbs
    short = "" if frac >= UPDATE_TARGET else f", short by {UPDATE_TARGET - frac:.0%}"
    notes = [f"{frac:.0%} of copy{short}", _attempt("sweep", lambda: update_sweep(args, kwargs, nbytes, timer))]
    notes.append(_attempt("host", lambda: f"host {host_ms(tri_fn, device, 50 if device == 'cuda' else 1):.3f} ms/call"))
    if device == "cuda":
        notes.append(_attempt("graph", lambda: f"graph replay {nbytes / graph_ms(tri_fn, timer) / 1e6:.0f} GB/s"))
    case = f"state update B{batch} H{layer.heads} P{layer.head_dim} N{layer.d_state} fp32 state"
    return perf_row(FAMILY, case, "GB/s", tri, tor, "mamba_ssm", MAMBA["update"], frac,
                    f">= {UPDATE_TARGET:.0%} copy BW", frac >= UPDATE_TARGET, "; ".join(notes),
                    op="selective_state_update", ms=ms)


def run(results: list[dict[str, Any]], device: str = "cuda", *, small: bool = False,
        timer: Timer = median_ms) -> None:
    """Correctness, then timings; appends one dict per table line to `results`.

    `small` shrinks every size and the layer, and checks bf16 only (a CPU run under the Triton interpreter).
    """
    results.extend(correctness(device, (torch.bfloat16,) if small else (torch.float16, torch.bfloat16,
                                                                        torch.float32), small=small))
    div = 64 if small else 1
    copy_gbs = copy_bandwidth_gbs(device, (2 << 30) // div**3, timer)
    gemm = matmul_tflops(device, 8192 // div, timer)
    print(f"copy bandwidth {copy_gbs:.0f} GB/s, bf16 matmul {gemm:.0f} TFLOP/s", flush=True)
    layer = TINY if small else MAMBA2_130M
    benches: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        (f"scan {label}", lambda b=b, n=n, label=label: bench_scan(device, copy_gbs, gemm, b, max(3, n // div), label,
                                                                   layer=layer, timer=timer))
        for label, b, n in (("8x2048", 8, 2048), ("1x16384", 1, 16384), ("1x2048", 1, 2048))
    ]
    rows = 4 if small else 64
    benches.append(("state update", lambda: bench_update(device, copy_gbs, batch=rows, slots=2 * rows, layer=layer,
                                                         timer=timer)))
    run_perf(results, FAMILY, benches, format_table)


def format_table(results: list[dict[str, Any]]) -> str:
    """The compact table: correctness lines, then one line per timing."""
    return "\n".join(format_rows(results, 62, 6, rate=".1f", ratio=".1f"))


def main() -> int:
    return bench_main("gpu_ssm", run, format_table, header=62)


if __name__ == "__main__":
    sys.exit(main())

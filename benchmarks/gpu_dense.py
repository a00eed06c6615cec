"""GPU check and benchmark of the Triton dense kernels against the targets below (run on the H200).

    python benchmarks/gpu_dense.py            # correctness, then timings, then the table (< 3 min)

1. Correctness at realistic sizes, fp16 and bf16 (fp32 for a few): the Triton provider through the public
   functions against the operator's reference run on float64 copies (on the same device), compared with
   the tolerance table; cache writes, final and updated conv states and untouched V columns bit for bit.
   One PASS/FAIL line per case.
2. Timings (``triton.testing.do_bench``, median), bf16, measured in this run: the copy bandwidth (a 2 GiB
   device-to-device copy, read + write bytes) and bf16 ``torch.matmul`` TFLOP/s at 8192^3, then each
   operator at >= 256 MB of input against the torch provider:
   - RmsNorm, fused add + RmsNorm, Add, FusedQkNorm, paged-cache write, causal_conv1d (both layouts):
     bytes read + written per second; target >= 85% of the copy bandwidth and faster than the torch
     provider (FusedQkNorm: >= 1.5x the torch provider's two separate RmsNorms of the Q and K heads);
   - Gemm 8192^3 with bias (``nn.Linear`` layout): TFLOP/s; target >= 0.8x ``torch.matmul`` + bias.
   Add is timed out of place and in place. Each Triton/torch pair is timed on the same buffers, alternately
   twice (the better median of each), so neither side gets the cold or the hot clock; ``do_bench`` clears
   L2 before every call. The total wall time is printed before the final table.

`run(results)` appends one dict per table line (``kind`` "check" or "perf", the same keys as
benchmarks/gpu_attention.py) for benchmarks/ops.py. Timed calls go straight to the resolved
implementations (the operators' calling conventions) with index checks off, so host-side checks and
synchronizations stay out of the measurement. ``small=True`` shrinks every size (the CPU test of this
script runs it so, under the Triton interpreter, with a stand-in timer).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import infiniops_py
from infiniops_py.testing.compare import bits_equal, compare
from infiniops_py.testing.tolerances import tolerance

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)  # benchmarks/_common.py, also when a test loads this file by its path
from _common import (
    Timer,
    bench_main,
    check_row,
    copy_bandwidth_gbs,
    format_rows,
    matmul_tflops,
    median_ms,
    perf_row,
    resolved_call,
    run_perf,
)

FAMILY = "dense"
BANDWIDTH_TARGET = 0.85  # x copy bandwidth
QK_NORM_TARGET = 1.5  # x the torch provider's two separate norms
GEMM_TARGET = 0.8  # x torch.matmul + bias

Case = tuple[str, str, Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]]


def _randn(*shape: int, dtype: torch.dtype, device: str, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Drawn on the host (a CPU generator), then moved: the same numbers on every device."""
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * scale).to(device=device, dtype=dtype)


# --- correctness -----------------------------------------------------------------------------------


def correctness_cases(dtype: torch.dtype, device: str, small: bool = False) -> list[Case]:
    """(name, operator, build) triples; `build()` makes fresh ``(args, kwargs)`` of the public function."""
    gen = torch.Generator().manual_seed(0)

    def r(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return _randn(*shape, dtype=dtype, device=device, gen=gen, scale=scale)

    def norm_w(h: int) -> torch.Tensor:
        return 1 + r(h, scale=0.1)

    def z(n: int) -> int:  # small: the same code paths at sizes the interpreter gets through in seconds
        return max(2, n // 32) if small else n

    big, m, n, k = z(4096), z(333), z(1000), z(777)
    tokens = 8 if small else 4096  # the per-token kernels run one program per token: few under the interpreter
    return [
        (f"gemm {big}^3 linear+bias", "gemm", lambda: ((r(big, big), r(big, big)), {"bias": r(big),
                                                                                   "trans_b": True})),
        (f"gemm decode M=1 N={z(6144)} linear", "gemm", lambda: ((r(1, big), r(z(6144), big)), {"trans_b": True})),
        (f"gemm {m}x{n}x{k} a^T c[N] beta", "gemm",
         lambda: ((r(k, m), r(k, n)), {"trans_a": True, "c": r(n), "alpha": -0.999, "beta": 100.001})),
        (f"gemm batched 4x{z(512)}x{z(512)}x{z(256)} out=c", "gemm", _gemm_out_is_c(r, z(512), z(256))),
        (f"add [{big}x{2 * big}]", "add", lambda: ((r(big, 2 * big), r(big, 2 * big)), {})),
        (f"add [{big}x{2 * big}]+[{2 * big}] alpha", "add", lambda: ((r(big, 2 * big), r(2 * big)), {"alpha": -0.5})),
        ("add 5-D broadcast in place", "add", _add_in_place(r)),
        (f"add [{big}x{big}] flat in place", "add", _add_flat_in_place(r, big)),
        (f"rms_norm [{big}x{2 * big}]", "rms_norm",
         lambda: ((r(big, 2 * big, scale=1 / (4 * big)), norm_w(2 * big)), {})),
        ("rms_norm [83x769] strided", "rms_norm", lambda: ((r(83, 800)[:, :769], norm_w(769)), {})),
        (f"rms_norm [7x{z(65536)}]", "rms_norm", lambda: ((r(7, z(65536), scale=1e-3), norm_w(z(65536))), {})),
        (f"fused_add_rms_norm [{big}x5125]", "fused_add_rms_norm",
         lambda: ((r(big, 5125, scale=1e-4), r(big, 5125, scale=1e-4), norm_w(5125)), {})),
        (f"fused_qk_norm T{tokens} 32/8h D128", "fused_qk_norm", _qk_norm(r, norm_w, tokens, 32, 8, 128)),
        ("fused_qk_norm T83 16/4h D64", "fused_qk_norm", _qk_norm(r, norm_w, 83, 16, 4, 64)),
        ("fused_qk_norm T7 8/1h D256", "fused_qk_norm", _qk_norm(r, norm_w, 7, 8, 1, 256)),
        (f"reshape_and_cache_flash T{tokens} D128 bs16", "reshape_and_cache_flash",
         _cache(r, tokens, 8, 128, 16, z(5000))),
        (f"reshape_and_cache_flash T{z(500)} D80 bs256", "reshape_and_cache_flash",
         _cache(r, z(500), 4, 80, 256, 12)),
        (f"causal_conv1d D{z(4128)} L{z(1134)} W4 states", "causal_conv1d",
         _conv(r, gen, 2, z(4128), z(1134), 4, False, False)),
        (f"causal_conv1d B8 D{z(2048)} L{z(1100)} W4 states (tuned tile)", "causal_conv1d",
         _conv(r, gen, 8, z(2048), z(1100), 4, False, False)),
        (f"causal_conv1d B2 D{z(4096)} L{z(1000)} W4 channel-last states", "causal_conv1d",
         _conv(r, gen, 2, z(4096), z(1000), 4, True, False)),
        (f"causal_conv1d D64 L{z(4096)} W3 channel-last seq_idx", "causal_conv1d",
         _conv(r, gen, 2, 64, z(4096), 3, True, True)),
        (f"causal_conv1d_update B{z(64)} D{z(4096)} S=W+10", "causal_conv1d_update",
         _conv_update(r, z(64), z(4096), 4, 14, z(80))),
    ]


def _gemm_out_is_c(r: Callable[..., torch.Tensor], n: int,
                   k: int) -> Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]:
    def build() -> tuple[tuple[Any, ...], dict[str, Any]]:
        c = r(4, n, n)
        return (r(4, n, k), r(4, k, n)), {"c": c, "beta": 0.5, "bias": r(n), "out": c}
    return build


def _add_in_place(r: Callable[..., torch.Tensor]) -> Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]:
    def build() -> tuple[tuple[Any, ...], dict[str, Any]]:
        a = r(3, 12, 5, 15, 6)
        return (a, r(12, 1, 15, 1)), {"alpha": 2.0, "out": a}
    return build


def _add_flat_in_place(r: Callable[..., torch.Tensor], n: int) -> Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]:
    def build() -> tuple[tuple[Any, ...], dict[str, Any]]:  # 2**24 elements: the autotuned flat kernel
        a = r(n, n)
        return (a, r(n, n)), {"alpha": -0.5, "out": a}
    return build


def _qk_norm(r: Callable[..., torch.Tensor], norm_w: Callable[[int], torch.Tensor], t: int, hq: int, hkv: int,
             d: int) -> Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]:
    def build() -> tuple[tuple[Any, ...], dict[str, Any]]:
        width = (hq + 2 * hkv) * d
        qkv = r(t, width + 64)[:, :width]  # strided rows
        return (qkv, norm_w(d), norm_w(d)), {"num_q_heads": hq, "num_kv_heads": hkv, "head_dim": d, "eps": 1e-6}
    return build


def _cache(r: Callable[..., torch.Tensor], t: int, hkv: int, d: int, block: int,
           blocks: int) -> Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]:
    def build() -> tuple[tuple[Any, ...], dict[str, Any]]:
        qkv = r(t, 6 * hkv * d)  # key/value: strided views of a packed projection
        key = qkv[:, 4 * hkv * d:5 * hkv * d].view(t, hkv, d)
        value = qkv[:, 5 * hkv * d:].view(t, hkv, d)
        slots = torch.randperm(blocks * block, generator=torch.Generator().manual_seed(t))[: t - 3]
        slots[::7] = -1
        caches = r(blocks, block, hkv, d), r(blocks, block, hkv, d)
        return (key, value, *caches, slots.to(key.device)), {}
    return build


def _conv(r: Callable[..., torch.Tensor], gen: torch.Generator, batch: int, dim: int, length: int, width: int,
          channel_last: bool, seq_idx: bool) -> Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]:
    def build() -> tuple[tuple[Any, ...], dict[str, Any]]:
        x = r(batch, length, dim).transpose(1, 2) if channel_last else r(batch, dim, length)
        kwargs: dict[str, Any] = {"activation": "silu", "initial_states": r(batch, dim, width - 1),
                                  "return_final_states": True}
        if seq_idx:
            seq = torch.zeros(batch, length, dtype=torch.int32)
            for cut in torch.randint(1, length, (6,), generator=gen).tolist():
                seq[:, cut:] += 1
            seq[1, length - 100:] = -1
            kwargs["seq_idx"] = seq.to(x.device)
        return (x, r(dim, width, scale=width**-0.5), r(dim)), kwargs
    return build


def _conv_update(r: Callable[..., torch.Tensor], batch: int, dim: int, width: int, state_len: int,
                 slots: int) -> Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]:
    def build() -> tuple[tuple[Any, ...], dict[str, Any]]:
        state = r(slots, state_len, dim).transpose(1, 2)  # vLLM's layout: stride 1 along D
        index = torch.randperm(slots, generator=torch.Generator().manual_seed(1))[:batch].to(torch.int32)
        index[::5] = -1
        return ((r(batch, dim), state, r(dim, width, scale=width**-0.5), r(dim)),
                {"activation": "silu", "conv_state_indices": index.to(state.device)})
    return build


def _f64(tree: Any, memo: dict[int, Any]) -> Any:
    """float64 copies of the floating tensors in `tree` (one copy per tensor object: out=c stays aliased)."""
    if isinstance(tree, torch.Tensor):
        if id(tree) not in memo:
            memo[id(tree)] = tree.to(torch.float64, copy=True) if tree.is_floating_point() else tree
        return memo[id(tree)]
    if isinstance(tree, tuple):
        return tuple(_f64(t, memo) for t in tree)
    if isinstance(tree, dict):
        return {k: _f64(v, memo) for k, v in tree.items()}
    return tree


def _outputs(op: str, result: Any, args: tuple[Any, ...]) -> list[tuple[torch.Tensor, bool]]:
    """The compared tensors of one call and whether each must match bit for bit."""
    if op == "fused_add_rms_norm":
        return [(args[0], False), (args[1], False)]
    if op == "fused_qk_norm":
        return [(args[0], False)]
    if op == "reshape_and_cache_flash":
        return [(args[2], True), (args[3], True)]
    if op == "causal_conv1d":
        return [(result[0], False), (result[1], True)]
    if op == "causal_conv1d_update":
        return [(result, False), (args[1], True)]
    return [(result, False)]


def check(op: str, build: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]) -> tuple[bool, float, str]:
    """Run one case through Triton and through the float64 reference; (ok, worst |err|, failure message)."""
    args, kwargs = build()
    memo: dict[int, Any] = {}
    ref_args, ref_kwargs = _f64(args, memo), _f64(kwargs, memo)
    fn = getattr(infiniops_py, op)
    v_before = args[0][:, (kwargs["num_q_heads"] + kwargs["num_kv_heads"]) * kwargs["head_dim"]:].clone() \
        if op == "fused_qk_norm" else None
    with infiniops_py.use("reference"):
        expected = _outputs(op, fn(*ref_args, **ref_kwargs), ref_args)
    with infiniops_py.use("triton"):
        got = _outputs(op, fn(*args, **kwargs), args)
    if v_before is not None and not bits_equal(args[0][:, -v_before.shape[1]:], v_before):
        return False, math.inf, "V columns changed"
    dtype = str(args[0].dtype).removeprefix("torch.")
    k = args[0].shape[-2 if kwargs.get("trans_a") else -1] if op == "gemm" else None
    worst, failures = 0.0, []
    for (g, exact), (e, _) in zip(got, expected):
        err, failure = compare(op, g, e, tolerance(op, dtype), k=k, exact=exact)
        worst = max(worst, err)
        if failure:
            failures.append(failure)
    return not failures, worst, "; ".join(failures)


def correctness(device: str, dtypes: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16),
                small: bool = False) -> list[dict[str, Any]]:
    rows = []
    for dtype in dtypes:
        for name, op, build in correctness_cases(dtype, device, small):
            rows.append(check_row(FAMILY, name, dtype, lambda op=op, build=build: check(op, build)))
    return rows


# --- timings ---------------------------------------------------------------------------------------


def _bandwidth_row(case: str, nbytes: int, tri_ms: float, torch_ms: float, copy_gbs: float, *,
                   baseline: str = "torch", baseline_ms: float | None = None,
                   speedup: float = 1.0) -> dict[str, Any]:
    """A GB/s line; the target: >= 85% of the copy bandwidth and faster than the baseline (by `speedup`)."""
    base_ms = torch_ms if baseline_ms is None else baseline_ms
    tri, tor, base = (nbytes / ms / 1e6 for ms in (tri_ms, torch_ms, base_ms))
    frac, ratio = tri / copy_gbs, base_ms / tri_ms
    need = f">= {speedup}x {baseline}" if speedup > 1 else f"> {baseline}"
    fast_enough = ratio >= speedup if speedup > 1 else ratio > 1
    misses = [f"{BANDWIDTH_TARGET - frac:.0%} below the copy target"] if frac < BANDWIDTH_TARGET else []
    misses += [] if fast_enough else [f"needs {need}"]
    note = f"{frac:.0%} of copy, {ratio:.2f}x {baseline}" + (f" (MISS: {'; '.join(misses)})" if misses else "")
    ms = {"triton": tri_ms, "torch": torch_ms, **({baseline: base_ms} if baseline_ms is not None else {})}
    return perf_row(FAMILY, case, "GB/s", tri, tor, baseline, base, frac,
                    f">= {BANDWIDTH_TARGET:.0%} copy BW, {need}", not misses, note, op=case.split()[0], ms=ms)


def _add_config() -> str:
    """The flat add kernel's autotuned configuration, when it tuned (large sizes on a GPU)."""
    from infiniops_triton import add as triton_add

    best = getattr(triton_add._add_flat_tuned, "best_config", None)
    if best is None:
        return ""
    return f"; flat add BLOCK {best.kwargs['BLOCK']}, {best.num_warps} warps, loads {best.kwargs['EVICT'] or 'default'}"


def perf_cases(device: str, copy_gbs: float, gemm_tflops: float, timer: Timer,
               small: bool = False) -> list[Callable[[], dict[str, Any]]]:
    """One closure per timed line (each allocates its own tensors when called)."""
    bf16, dev = torch.bfloat16, device
    gen = torch.Generator().manual_seed(1)
    s = 64 if small else 1  # small: sizes shrink by `s` in each of two dims (by s**2 for a token count)

    def r(*shape: int, scale: float = 1.0) -> torch.Tensor:  # drawn on the device: big inputs, quickly
        return (torch.randn(shape, device=dev) * scale).to(bf16)

    def both(op: str, problem: dict[str, Any], *args: Any) -> tuple[float, float]:
        """(triton ms, torch ms) on the same buffers, timed alternately twice, the better median of each: neither
        side runs first on a cold GPU clock or last on a hot one."""
        fields = {"device_type": torch.device(dev).type, "dtype": "bfloat16", **problem}
        calls = [resolved_call(p, op, fields, *args) for p in ("triton", "torch")]
        times = [[timer(call) for call in calls] for _ in range(2)]
        return min(t[0] for t in times), min(t[1] for t in times)

    def rms() -> dict[str, Any]:
        t, h = 32768 // s, 4096 // s
        x, w, out = r(t, h, scale=1 / h), 1 + r(h, scale=0.1), torch.empty(t, h, dtype=bf16, device=dev)
        tri, tor = both("rms_norm", {"hidden_size": h}, x, w, 1e-6, out)
        return _bandwidth_row(f"rms_norm [{t}x{h}] bf16", 2 * x.nbytes, tri, tor, copy_gbs)

    def fused() -> dict[str, Any]:
        t, h = 32768 // s, 4096 // s
        x, res, w = r(t, h, scale=1 / h), r(t, h, scale=1 / h), 1 + r(h, scale=0.1)
        tri, tor = both("fused_add_rms_norm", {"hidden_size": h}, x, res, w, 1e-6)
        return _bandwidth_row(f"fused_add_rms_norm [{t}x{h}] bf16", 4 * x.nbytes, tri, tor, copy_gbs)

    def add(inplace: bool) -> Callable[[], dict[str, Any]]:
        def bench() -> dict[str, Any]:
            a, b = r(16384 // s, 8192 // s), r(16384 // s, 8192 // s, scale=1e-3)  # small b: in place stays finite
            out = a if inplace else torch.empty_like(a)
            tri, tor = both("add", {"broadcast": False, "inplace": inplace}, a, b, 1.0, out)
            row = _bandwidth_row(f"add [{a.shape[0]}x{a.shape[1]}]{' in place' if inplace else ''} bf16", 3 * a.nbytes,
                                 tri, tor, copy_gbs)
            row["note"] += _add_config()
            return row
        bench.__name__ = "add in place" if inplace else "add"
        return bench

    def qk_norm() -> dict[str, Any]:
        t, hq, hkv, d = 24576 // s**2, 32, 8, 128
        qkv, qw, kw = r(t, (hq + 2 * hkv) * d), 1 + r(d, scale=0.1), 1 + r(d, scale=0.1)
        problem = {"head_dim": d, "num_q_heads": hq, "num_kv_heads": hkv}
        tri, tor = both("fused_qk_norm", problem, qkv, qw, kw, hq, hkv, d, 1e-6)
        q, k = qkv[:, : hq * d].view(t, hq, d), qkv[:, hq * d:(hq + hkv) * d].view(t, hkv, d)

        def two_norms() -> None:  # what a model without the fused operator runs (HF's q_norm, k_norm)
            with infiniops_py.use("torch"):
                infiniops_py.rms_norm(q, qw, 1e-6)
                infiniops_py.rms_norm(k, kw, 1e-6)

        nbytes = 2 * t * (hq + hkv) * d * 2
        return _bandwidth_row(f"fused_qk_norm T{t} {hq}/{hkv}h D{d} bf16", nbytes, tri, tor, copy_gbs,
                              baseline="2 torch norms", baseline_ms=timer(two_norms), speedup=QK_NORM_TARGET)

    def cache() -> dict[str, Any]:
        t, hkv, d, block = 65536 // s**2, 8, 128, 16
        key, value = r(t, hkv, d), r(t, hkv, d)
        blocks = t // block + 64
        kc, vc = r(blocks, block, hkv, d), r(blocks, block, hkv, d)
        slots = torch.randperm(blocks * block, generator=gen)[:t].to(dev)
        problem = {"head_dim": d, "block_size": block, "num_kv_heads": hkv}
        tri, tor = both("reshape_and_cache_flash", problem, key, value, kc, vc, slots)
        return _bandwidth_row(f"reshape_and_cache_flash T{t} {hkv}h D{d} bs{block} bf16", 4 * key.nbytes, tri, tor,
                              copy_gbs)

    def conv(channel_last: bool) -> Callable[[], dict[str, Any]]:
        def bench() -> dict[str, Any]:
            b, dim, length, width = 8, 4096 // s, 4096 // s, 4
            x = r(b, length, dim).transpose(1, 2) if channel_last else r(b, dim, length)
            out = torch.empty_like(x)
            w, bias = r(dim, width, scale=0.5), r(dim)
            problem = {"width": width, "has_bias": True, "silu": True, "channel_last": channel_last,
                       "has_seq_idx": False, "has_initial_states": False, "return_final_states": False}
            tri, tor = both("causal_conv1d", problem, x, w, bias, "silu", None, None, out, None)
            layout = "channel-last" if channel_last else "channel-first"
            return _bandwidth_row(f"causal_conv1d B{b} D{dim} L{length} W{width} {layout} bf16", 2 * x.nbytes, tri,
                                  tor, copy_gbs)
        bench.__name__ = f"causal_conv1d {'channel-last' if channel_last else 'channel-first'}"
        return bench

    def gemm() -> dict[str, Any]:
        n = 8192 // s
        a, b, bias = r(n, n), r(n, n), r(n)
        out = torch.empty(n, n, dtype=bf16, device=dev)
        problem = {"batched": False, "trans_a": False, "trans_b": True, "has_bias": True, "has_c": False}
        tri, tor = both("gemm", problem, a, b, None, bias, 1.0, 0.0, False, True, out)
        base = timer(lambda: torch.matmul(a, b.t()) + bias)
        flops = 2.0 * n**3
        tri_t, tor_t, base_t = (flops / ms / 1e9 for ms in (tri, tor, base))
        ratio = tri_t / base_t
        note = f"{ratio:.2f}x matmul+bias" + ("" if ratio >= GEMM_TARGET else f", short by {GEMM_TARGET - ratio:.2f}x")
        return perf_row(FAMILY, f"gemm {n}^3 linear+bias bf16", "TFLOP/s", tri_t, tor_t, "matmul+bias", base_t,
                        tri_t / gemm_tflops, f">= {GEMM_TARGET}x matmul+bias", ratio >= GEMM_TARGET, note, op="gemm",
                        ms={"triton": tri, "torch": tor, "matmul+bias": base})

    return [rms, fused, add(False), add(True), qk_norm, cache, conv(False), conv(True), gemm]


def run(results: list[dict[str, Any]], device: str = "cuda", *, timer: Timer = median_ms,
        small: bool = False) -> None:
    """Correctness, then timings; appends one dict per table line to `results`.

    `small` shrinks every size and checks bfloat16 (and float32) only: the CPU test's mode.
    """
    results.extend(correctness(device, dtypes=(torch.bfloat16,) if small else (torch.float16, torch.bfloat16),
                               small=small))
    results.extend(correctness(device, dtypes=(torch.float32,), small=True))
    copy_gbs = copy_bandwidth_gbs(device, (1 << 20) if small else (2 << 30), timer)
    gemm = matmul_tflops(device, 128 if small else 8192, timer)
    print(f"copy bandwidth {copy_gbs:.0f} GB/s, bf16 matmul {gemm:.0f} TFLOP/s", flush=True)
    benches = perf_cases(device, copy_gbs, gemm, timer, small)
    run_perf(results, FAMILY, [(bench.__name__, bench) for bench in benches], format_table)


def format_table(results: list[dict[str, Any]]) -> str:
    """The compact table: correctness lines, then one line per timing."""
    return "\n".join(format_rows(results, 58, 4))


def main() -> int:
    return bench_main("gpu_dense", run, format_table, header=58, wall_time=True)


if __name__ == "__main__":
    sys.exit(main())

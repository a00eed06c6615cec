"""GPU benchmark of the Triton FlashAttention kernels against the targets below (run on the H200).

    python benchmarks/gpu_attention.py            # correctness, then timings, then the table (< 3 min)

1. Correctness at realistic sizes, fp16 and bf16: the Triton provider through the public functions against
   the float64 reference with the tolerance table's rule (max error <= 2x (varlen) or 3x (kvcache) the
   error of the reference run in the input dtype); the kvcache cases also check that the appended cache is
   bit-identical to the reference's. One PASS/FAIL line per case.
2. Timings (``triton.testing.do_bench``, median), bf16, measured in this run: the copy bandwidth (a 2 GiB
   device-to-device copy, read + write bytes), bf16 ``torch.matmul`` TFLOP/s at 8192^3, then
   - varlen causal prefill, D=128, 4 sequences x 32 heads x 4096 tokens: TFLOP/s (causal counted as half)
     of Triton, of the torch provider and of ``F.scaled_dot_product_attention(is_causal=True)`` on the
     same shapes; target: Triton >= 0.8x SDPA;
   - paged decode, batch 64, 32 query / 8 KV heads, D=128, 4096-token contexts, block size 16: KV bytes
     read per second of Triton and of the torch provider; target: Triton >= 75% of the copy bandwidth.

`run(results)` appends one dict per line of the table (``kind`` "check" or "perf"), for benchmarks/ops.py.
Timed calls go straight to the resolved implementations (the operator's calling convention) with index
checks off, so host-side checks and synchronizations stay out of the measurement.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import infiniops_py
from infiniops_py.operators.flash_attn import in_input_dtype
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
from _common import randn as _randn

FAMILY = "attention"
PREFILL_TARGET = 0.8  # x SDPA TFLOP/s
DECODE_TARGET = 0.75  # x copy bandwidth


# --- inputs ----------------------------------------------------------------------------------------


def varlen_case(lens_q: list[int], lens_k: list[int], hq: int, hkv: int, d: int, dtype: torch.dtype, device: str,
                *, causal: bool = True, window: tuple[int, int] = (-1, -1), softcap: float = 0.0, page: int = 0,
                seed: int = 0) -> dict[str, Any]:
    """Keyword arguments of `flash_attn_varlen`: packed q/k/v, or k/v in a paged cache behind a shuffled
    block table (the cache's unused pages hold NaN, which must never reach the output)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32, device=device)
    q = _randn(int(cu_q[-1]), hq, d, dtype=dtype, device=device, gen=gen)
    k = _randn(int(cu_k[-1]), hkv, d, dtype=dtype, device=device, gen=gen)
    v = _randn(int(cu_k[-1]), hkv, d, dtype=dtype, device=device, gen=gen)
    args: dict[str, Any] = {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k,
                            "max_seqlen_q": max(lens_q), "max_seqlen_k": max(lens_k), "causal": causal,
                            "window_size": window, "softcap": softcap}
    if page:
        args["k"], args["v"], args["block_table"] = _paginate(k, v, lens_k, page, gen)
    return args


def _paginate(k: torch.Tensor, v: torch.Tensor, lens: list[int], page: int,
              gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed ``[total, H, D]`` keys/values -> NaN-filled paged caches plus a shuffled block table."""
    per_seq = [max(1, math.ceil(n / page)) for n in lens]
    width = max(per_seq)
    num_pages = sum(per_seq) + 2
    perm = torch.randperm(num_pages, generator=gen, device=k.device).to(torch.int32)
    table = torch.zeros(len(lens), width, dtype=torch.int32, device=k.device)
    kc = torch.full((num_pages, page, *k.shape[1:]), float("nan"), dtype=k.dtype, device=k.device)
    vc = torch.full_like(kc, float("nan"))
    start, used = 0, 0
    for b, n in enumerate(lens):
        ids = perm[used:used + per_seq[b]]
        table[b, :per_seq[b]] = ids
        used += per_seq[b]
        pos = torch.arange(n, device=k.device)
        kc[ids.long()[pos // page], pos % page] = k[start:start + n]
        vc[ids.long()[pos // page], pos % page] = v[start:start + n]
        start += n
    return kc, vc, table


def kvcache_case(batch: int, cached: list[int], hq: int, hkv: int, d: int, dtype: torch.dtype, device: str, *,
                 capacity: int, sq: int = 1, new: int = 1, page: int = 0, window: tuple[int, int] = (-1, -1),
                 softcap: float = 0.0, seed: int = 0) -> dict[str, Any]:
    """Keyword arguments of `flash_attn_with_kvcache`: a contiguous ``[B, capacity, Hkv, D]`` or paged cache
    (shuffled block table), `cached` tokens per sequence, `new` tokens appended per sequence."""
    gen = torch.Generator(device=device).manual_seed(seed)
    q = _randn(batch, sq, hq, d, dtype=dtype, device=device, gen=gen)
    if page:
        width = math.ceil(capacity / page)
        num_pages = batch * width + 3
        kc = _randn(num_pages, page, hkv, d, dtype=dtype, device=device, gen=gen)
        table = torch.randperm(num_pages, generator=gen, device=device)[:batch * width].view(batch, width)
        extra = {"block_table": table.to(torch.int32).contiguous()}
    else:
        kc = _randn(batch, capacity, hkv, d, dtype=dtype, device=device, gen=gen)
        extra = {}
    args: dict[str, Any] = {"q": q, "k_cache": kc, "v_cache": _randn(*kc.shape, dtype=dtype, device=device, gen=gen),
                            "cache_seqlens": torch.tensor(cached, dtype=torch.int32, device=device),
                            "causal": True, "window_size": window, "softcap": softcap, **extra}
    if new:
        args["k"] = _randn(batch, new, hkv, d, dtype=dtype, device=device, gen=gen)
        args["v"] = _randn(batch, new, hkv, d, dtype=dtype, device=device, gen=gen)
    return args


# --- correctness -----------------------------------------------------------------------------------


def _cast(args: dict[str, Any], dtype: torch.dtype | None, device: str | None = None) -> dict[str, Any]:
    """Fresh copies (caches are updated in place): float tensors to `dtype` (None: keep), all to `device`."""
    out = {}
    for name, value in args.items():
        if isinstance(value, torch.Tensor):
            value = value.to(device or value.device)
            value = value.to(dtype) if dtype is not None and value.is_floating_point() else value.clone()
        out[name] = value
    return out


def check(op: str, args: dict[str, Any], reference_device: str = "cpu") -> tuple[bool, float, str]:
    """Run `op` through the Triton provider and compare with the float64 reference: the max error must be
    <= 2x (varlen) or 3x (kvcache) the error of the reference run in the input dtype (flash-attention's rule).

    Returns (passed, max abs error, failure message or "").
    """
    fn = getattr(infiniops_py, op)
    dtype = args["q"].dtype
    with infiniops_py.use("triton"):
        mine = _cast(args, None)
        got = fn(**mine)
    with infiniops_py.use("reference"):
        ref_args = _cast(args, torch.float64, reference_device)
        ref = fn(**ref_args)
        low_args = _cast(args, None, reference_device)
        with in_input_dtype():  # flash-attention's baseline: its reference in the input dtype
            low = fn(**low_args)
    worst, failure = compare(op, got, ref, tolerance(op, str(dtype).removeprefix("torch.")), low=low)
    if failure is None and op == "flash_attn_with_kvcache" and "k" in args:
        for name in ("k_cache", "v_cache"):
            if not bits_equal(mine[name].cpu(), low_args[name].cpu()):
                failure = f"{name} after the append differs from the reference's"
    return failure is None, worst, failure or ""


def correctness_cases(dtype: torch.dtype, device: str, scale: int = 1) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, op, kwargs) at realistic sizes; `scale` divides every length (for a quick CPU run)."""
    def n(x: int) -> int:
        return max(1, x // scale)

    lens_q, lens_k = [n(1000), n(2048), n(77), n(513)], [n(1000), n(2048), n(300), n(700)]
    return [
        ("varlen causal D128 GQA4", "flash_attn_varlen",
         varlen_case(lens_q, lens_k, 32, 8, 128, dtype, device, seed=1)),
        ("varlen window(256,0) D64", "flash_attn_varlen",
         varlen_case(lens_q, lens_k, 8, 8, 64, dtype, device, window=(n(256), -1), seed=2)),
        ("varlen softcap50 paged256 D256", "flash_attn_varlen",
         varlen_case(lens_q, lens_k, 8, 2, 256, dtype, device, softcap=50.0, page=256, seed=3)),
        ("varlen non-causal paged16 D80", "flash_attn_varlen",
         varlen_case(lens_q, lens_k, 8, 1, 80, dtype, device, causal=False, page=16, seed=4)),
        ("kvcache decode paged16 D128 GQA4", "flash_attn_with_kvcache",
         kvcache_case(16, [n(4000), n(17), 0, n(2500)] * 4, 32, 8, 128, dtype, device, capacity=n(4096), page=16,
                      seed=5)),
        ("kvcache decode B2 long D128 (split-K)", "flash_attn_with_kvcache",
         kvcache_case(2, [n(8000), n(5000)], 32, 8, 128, dtype, device, capacity=n(8192), seed=6)),
        ("kvcache Sq3 window softcap D64", "flash_attn_with_kvcache",
         kvcache_case(4, [n(900), n(30), n(600), 0], 16, 4, 64, dtype, device, capacity=n(1024) + 8, sq=3, new=3,
                      window=(n(128), -1), softcap=50.0, seed=7)),
    ]


def correctness(device: str, dtypes: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16), scale: int = 1,
                reference_device: str | None = None) -> list[dict[str, Any]]:
    rows = []
    for dtype in dtypes:
        for name, op, args in correctness_cases(dtype, device, scale):
            rows.append(check_row(FAMILY, name, dtype,
                                  lambda op=op, args=args: check(op, args, reference_device or device)))
    return rows


# --- timings ---------------------------------------------------------------------------------------


def prefill_flops(batch: int, heads: int, seqlen: int, d: int, causal: bool = True) -> float:
    """Two matmuls of 2·S²·D flops per head; a causal mask halves them (the usual convention)."""
    flops = 4.0 * batch * heads * seqlen * seqlen * d
    return flops / 2 if causal else flops


def decode_kv_bytes(batch: int, context: int, hkv: int, d: int, elem: int = 2) -> int:
    """K and V bytes one decode step reads."""
    return 2 * batch * context * hkv * d * elem


def _problem(op: str, args: dict[str, Any]) -> dict[str, Any]:
    q = args["q"]
    kv = args["k_cache" if "k_cache" in args else "k"]
    table = args.get("block_table")
    fields = {"device_type": q.device.type, "dtype": str(q.dtype)[6:], "head_dim": q.shape[-1],
              "gqa_ratio": q.shape[-2] // kv.shape[-2], "causal": args["causal"],
              "local": args["window_size"] != (-1, -1), "softcap": args["softcap"] > 0, "paged": table is not None,
              "block_size": 0 if table is None else kv.shape[1]}
    if op == "flash_attn_with_kvcache":
        fields["append"] = "k" in args
    return fields


def implementation_call(provider: str, op: str, args: dict[str, Any], **extra: Any) -> Callable[[], Any]:
    """A no-argument callable running `provider`'s implementation of `op` on `args` (calling convention);
    `extra` keywords go to the implementation (the Triton decode takes ``splits``)."""
    problem = _problem(op, args)
    q = args["q"]
    scale = q.shape[-1] ** -0.5
    out = torch.empty_like(q)
    if op == "flash_attn_varlen":
        conv = (q, args["k"], args["v"], args["cu_seqlens_q"], args["cu_seqlens_k"], args["max_seqlen_q"],
                args["max_seqlen_k"], scale, args["causal"], args["window_size"], args["softcap"],
                args.get("block_table"), out)
    else:
        conv = (q, args["k_cache"], args["v_cache"], args["cache_seqlens"], args.get("block_table"), args.get("k"),
                args.get("v"), scale, args["causal"], args["window_size"], args["softcap"], out)
    return resolved_call(provider, op, problem, *conv, **extra)


def bench_prefill(device: str, gemm_tflops: float, *, batch: int = 4, heads: int = 32, seqlen: int = 4096,
                  d: int = 128, timer: Timer = median_ms) -> dict[str, Any]:
    """Varlen causal prefill (equal lengths, so SDPA runs the same problem) vs the torch provider and SDPA."""
    args = varlen_case([seqlen] * batch, [seqlen] * batch, heads, heads, d, torch.bfloat16, device, seed=11)
    flops = prefill_flops(batch, heads, seqlen, d)
    ms = {p: timer(implementation_call(p, "flash_attn_varlen", args)) for p in ("triton", "torch")}
    q4, k4, v4 = (args[n].view(batch, seqlen, heads, d).transpose(1, 2) for n in ("q", "k", "v"))
    ms["SDPA"] = timer(lambda: F.scaled_dot_product_attention(q4, k4, v4, is_causal=True))
    tri, tor, sdpa = (flops / ms[p] / 1e9 for p in ("triton", "torch", "SDPA"))
    ratio = tri / sdpa
    short = "" if ratio >= PREFILL_TARGET else f", short by {PREFILL_TARGET - ratio:.2f}x"
    tuned = _tuned_config("infiniops_triton._flash_attn_kernels", "attn_fwd_tuned")
    return perf_row(FAMILY, f"varlen causal prefill D{d} {batch}x{heads}hx{seqlen} bf16", "TFLOP/s", tri, tor,
                    "SDPA", sdpa, tri / gemm_tflops, f">= {PREFILL_TARGET}x SDPA", ratio >= PREFILL_TARGET,
                    f"{ratio:.2f}x SDPA{short}; tuned {tuned}", op="flash_attn_varlen", ms=ms)


def _tuned_config(module: str, name: str) -> str:
    """The configuration the Triton provider's autotuner picked last (diagnostics only)."""
    import importlib

    best = getattr(getattr(importlib.import_module(module), name, None), "best_config", None)
    if best is None:
        return "-"
    return " ".join(f"{k}={v}" for k, v in best.all_kwargs().items() if k in ("BLOCK_M", "BLOCK_N", "LAZY", "USE_TMA",
                                                                                 "num_warps", "num_stages"))


def bench_decode(device: str, copy_gbs: float, *, batch: int = 64, hq: int = 32, hkv: int = 8, d: int = 128,
                 context: int = 4096, page: int = 16, timer: Timer = median_ms) -> dict[str, Any]:
    """Paged decode (one query per sequence, no append) vs the torch provider, in KV bytes read per second."""
    args = kvcache_case(batch, [context] * batch, hq, hkv, d, torch.bfloat16, device, capacity=context, new=0,
                        page=page, seed=12)
    nbytes = decode_kv_bytes(batch, context, hkv, d)
    ms = {"triton": timer(implementation_call("triton", "flash_attn_with_kvcache", args))}
    tuned = _tuned_config("infiniops_triton._decode_kernels", "decode_split_tuned")
    ms["torch"] = timer(implementation_call("torch", "flash_attn_with_kvcache", args))
    tri, tor = nbytes / ms["triton"] / 1e6, nbytes / ms["torch"] / 1e6
    sweep = {s: nbytes / timer(implementation_call("triton", "flash_attn_with_kvcache", args, splits=s)) / 1e6
             for s in (1, 2, 4, 8)}  # how the split-K count matters here (diagnostics for tuning `num_splits`)
    frac = tri / copy_gbs
    short = "" if frac >= DECODE_TARGET else f", short by {DECODE_TARGET - frac:.0%}"
    by_split = ", ".join(f"{s}: {v:.0f}" for s, v in sweep.items())
    return perf_row(FAMILY, f"paged decode B{batch} {hq}/{hkv}h D{d} ctx{context} bs{page} bf16", "GB/s", tri, tor,
                    "copy", copy_gbs, frac, f">= {DECODE_TARGET:.0%} copy BW", frac >= DECODE_TARGET,
                    f"{frac:.0%} of copy{short}; tuned {tuned}; GB/s by splits {by_split}",
                    op="flash_attn_with_kvcache", ms=ms)


def run(results: list[dict[str, Any]], device: str = "cuda", *, scale: int = 1, timer: Timer = median_ms,
        dtypes: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)) -> None:
    """Correctness in `dtypes`, then timings; appends one dict per table line to `results`.

    `scale` divides every length and size (1 on the GPU: the target sizes above; larger for a quick CPU run).
    """
    results.extend(correctness(device, dtypes, scale=scale))
    copy_gbs = copy_bandwidth_gbs(device, (2 << 30) // scale**3, timer)
    gemm = matmul_tflops(device, 8192 // scale, timer)
    print(f"copy bandwidth {copy_gbs:.0f} GB/s, bf16 matmul {gemm:.0f} TFLOP/s", flush=True)
    benches: list[Callable[[], dict[str, Any]]] = [
        lambda: bench_prefill(device, gemm, seqlen=4096 // scale, timer=timer),
        lambda: bench_decode(device, copy_gbs, batch=max(1, 64 // scale), context=4096 // scale, timer=timer),
    ]
    run_perf(results, FAMILY, list(zip(("varlen causal prefill", "paged decode"), benches)))


def format_table(results: list[dict[str, Any]]) -> str:
    """The compact table: correctness lines, then one line per timing."""
    return "\n".join([f"{'case':<52} {'status':<6} detail", *format_rows(results, 52, 6)])


def main() -> int:
    return bench_main("gpu_attention", run, format_table)


if __name__ == "__main__":
    sys.exit(main())

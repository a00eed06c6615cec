"""Decode at the bandwidth limit (run on the H200): the decode Gemm beside cuBLAS, paged decode attention beside
SDPA on a dense cache of the same bytes, and the engine's decode step of the Qwen3-0.6B and Mamba-2-130m shapes.

    python3 -m pip install -q --no-deps --no-build-isolation -e . -e providers/torch -e providers/triton
    python3 benchmarks/gpu_decode.py [--json FILE] [--part gemm|add_norm|pre_norm|attention|engine ...]  # ~4 min
    python3 benchmarks/gpu_decode.py --smoke            # tiny sizes on the CPU: the script itself, no timing

1. Copy bandwidth: a 1 GiB device-to-device copy, (read + write bytes) / time, graph replay.
2. Gemm, bf16, x ``[M, K]`` times an ``nn.Linear`` weight ``[N, K]`` at the projection shapes of the Qwen3-0.6B,
   Llama-3-8B and Mamba-2-130m decode steps, M 1 and 16: ours (the Triton provider's public call) against
   cuBLAS (``F.linear``), each as one CUDA graph of calls over distinct weight copies (together past the L2
   cache, as a model's layers are), per call; GB/s is the weight's bytes per call time.
2b. Projection into the residual stream, bf16, at the Qwen3-0.6B o and down and Mamba-2-130m out_proj shapes, M 1
   and 16: ours fused (`gemm_add_rms_norm`, one kernel: the GEMV with the add and the RMSNorm in its epilogue)
   against ours unfused (`gemm` then `fused_add_rms_norm`, two kernels), each a graph over distinct weights.
2c. Norm then projection, bf16, at the Qwen3-0.6B qkv and gate_up (with SwiGLU) and Mamba-2-130m in_proj shapes,
   M 1 and 16: ours fused (`rms_norm_gemm`, one kernel: the GEMV with the RMSNorm in its prologue) against ours
   unfused (`rms_norm` then `gemm` or `gemm_swiglu`, two kernels), each a graph over distinct weights.
3. Paged decode attention, bf16, D 128, block size 16: ours (``flash_attn_with_kvcache``, Triton, appending the
   new k/v) against SDPA on a dense ``[B, Hkv, ctx, D]`` cache (GQA), each a graph over distinct caches; GB/s is
   the K/V bytes read per call.
4. Engine (random bf16 weights, CUDA graphs on): decode tok/s at batch 1 and 32 (Qwen3-0.6B), 1 (Mamba-2-130m),
   the kernels a decode step launches per layer, and its device busy time from one profiled step; Qwen3 again
   with the Triton kernels launched with programmatic dependent launch (`infiniops_triton._common.PDL`), and
   both models at batch 1 with ``add_norm="fused"`` (the o/down/out_proj projections as `gemm_add_rms_norm`),
   and Qwen3 at batch 1 and 32, Mamba-2 at batch 1, with ``add_norm="prologue"`` (each norm in the next projection's
   `rms_norm_gemm`, o/down/out_proj adding the residual as the Gemm's ``c``: two launches fewer per Qwen3 layer,
   one per Mamba-2 layer).

Every ratio is ours over the alternative measured in the same run, the same way (graph replay against graph
replay). Exit status 1 when a kernel's output differs from its alternative beyond the bf16 tolerance.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import infiniops_py as ops

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from _common import copy_bandwidth_gbs, json_option

GEMM_SHAPES = {  # name: (K, N) of the nn.Linear weight [N, K]
    "qwen3-0.6b qkv": (1024, 4096), "qwen3-0.6b o": (2048, 1024), "qwen3-0.6b gate_up": (1024, 6144),
    "qwen3-0.6b down": (3072, 1024), "llama3-8b qkv": (4096, 6144), "llama3-8b gate_up": (4096, 28672),
    "llama3-8b down": (14336, 4096), "mamba2-130m in_proj": (768, 3352),
}
ATTENTION_CASES = {  # name: (batch, context incl. the new token, Hq, Hkv)
    "qwen3-0.6b, B 1, ctx 130": (1, 130, 16, 8), "qwen3-0.6b, B 32, ctx 130": (32, 130, 16, 8),
    "B 64, ctx 4096, 32/8 heads": (64, 4096, 32, 8),
}
L2_PAST = 256 << 20  # bytes of distinct operands per graph: past the H200's 50 MB L2


def graph_time(calls: list[Callable[[], Any]], device: torch.device, replays: int = 20) -> float:
    """Seconds per call of `calls`, captured once as one CUDA graph (after one eager warm-up call each), the
    median of `replays` timed replays."""
    for fn in calls:
        fn()
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2] / len(calls)


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a 2 GiB device copy of random bytes, read plus write (`_common.copy_bandwidth_gbs`,
    the ceiling of the other GPU benchmarks)."""
    return copy_bandwidth_gbs(str(device), fill=True) * 1e9


def _copies(nbytes: int, smoke: bool) -> int:
    return 2 if smoke else max(2, math.ceil(L2_PAST / nbytes))


def _close(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
    return bool(torch.allclose(ours.float(), theirs.float(), rtol=1.6e-2, atol=2e-2))


def _our_gemm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    with ops.use("triton", op="gemm"):
        return ops.gemm(x, w, trans_b=True, out=out)


def bench_gemm(device: torch.device, smoke: bool, copy_bw: float) -> tuple[list[dict[str, Any]], bool]:
    rows, ok = [], True
    shapes = {"tiny": (64, 48)} if smoke else GEMM_SHAPES
    for name, (k, n) in shapes.items():
        for m in (1, 16):
            gen = torch.Generator(device=device).manual_seed(m * n + k)
            count = _copies(n * k * 2, smoke)
            weights = [torch.randn(n, k, generator=gen, device=device, dtype=torch.bfloat16) * k**-0.5
                       for _ in range(count)]
            x = torch.randn(m, k, generator=gen, device=device, dtype=torch.bfloat16)
            out = torch.empty(m, n, device=device, dtype=torch.bfloat16)
            ok &= _close(_our_gemm(x, weights[0], out), F.linear(x, weights[0]))
            if smoke:
                continue

            t_ours = graph_time([lambda w=w, x=x, out=out: _our_gemm(x, w, out) for w in weights], device)
            t_blas = graph_time([lambda w=w, x=x: F.linear(x, w) for w in weights], device)
            gbs = n * k * 2 / t_ours / 1e9
            rows.append({"shape": name, "M": m, "N": n, "K": k, "weight_mb": n * k * 2 / 1e6,
                         "ours_us": t_ours * 1e6, "cublas_us": t_blas * 1e6, "ours_gbs": gbs,
                         "of_copy": gbs * 1e9 / copy_bw, "speedup": t_blas / t_ours})
    return rows, ok


ADD_NORM_SHAPES = {"qwen3-0.6b o": (2048, 1024), "qwen3-0.6b down": (3072, 1024), "mamba2-130m out_proj": (1536, 768)}


def _fused(x: torch.Tensor, w: torch.Tensor, r: torch.Tensor, nw: torch.Tensor, out: torch.Tensor) -> None:
    with ops.use("triton", op="gemm_add_rms_norm"):
        ops.gemm_add_rms_norm(x, w, r, nw, 1e-6, out=out)


def _unfused(x: torch.Tensor, w: torch.Tensor, r: torch.Tensor, nw: torch.Tensor, out: torch.Tensor) -> None:
    _our_gemm(x, w, out)
    with ops.use("triton", op="fused_add_rms_norm"):
        ops.fused_add_rms_norm(out, r, nw, 1e-6)


def bench_add_norm(device: torch.device, smoke: bool) -> tuple[list[dict[str, Any]], bool]:
    """Part 2b: fused against unfused per call (graph replay); the outputs and residuals compared once."""
    rows, ok = [], True
    shapes = {"tiny": (64, 48)} if smoke else ADD_NORM_SHAPES
    for name, (k, n) in shapes.items():
        for m in (1, 16):
            gen = torch.Generator(device=device).manual_seed(m * n + k + 1)
            count = _copies(n * k * 2, smoke)
            bf16 = torch.bfloat16
            weights = [torch.randn(n, k, generator=gen, device=device, dtype=bf16) * k**-0.5 for _ in range(count)]
            x = torch.randn(m, k, generator=gen, device=device, dtype=bf16)
            r0 = torch.randn(m, n, generator=gen, device=device, dtype=bf16)
            nw = torch.randn(n, generator=gen, device=device, dtype=bf16) * 0.1 + 1
            out_f, out_u = (torch.empty(m, n, device=device, dtype=bf16) for _ in range(2))
            r_f, r_u = r0.clone(), r0.clone()
            _fused(x, weights[0], r_f, nw, out_f)
            _unfused(x, weights[0], r_u, nw, out_u)
            ok &= _close(out_f, out_u) and _close(r_f, r_u)
            if smoke:
                continue
            t_fused = graph_time([lambda w=w, a=(x, r_f, nw, out_f): _fused(a[0], w, *a[1:]) for w in weights],
                                 device)
            t_unfused = graph_time([lambda w=w, a=(x, r_u, nw, out_u): _unfused(a[0], w, *a[1:]) for w in weights],
                                   device)
            rows.append({"shape": name, "M": m, "N": n, "K": k, "fused_us": t_fused * 1e6,
                         "unfused_us": t_unfused * 1e6, "speedup": t_unfused / t_fused})
    return rows, ok


PRE_NORM_SHAPES = {  # name: (K, output columns N, swiglu): the weight is [N, K], or [2N, K] with swiglu
    "qwen3-0.6b qkv": (1024, 4096, False), "qwen3-0.6b gate_up + SwiGLU": (1024, 3072, True),
    "mamba2-130m in_proj": (768, 3352, False),
}


def _pre_fused(x: torch.Tensor, nw: torch.Tensor, w: torch.Tensor, swiglu: bool, out: torch.Tensor) -> None:
    with ops.use("triton", op="rms_norm_gemm"):
        ops.rms_norm_gemm(x, nw, w, 1e-6, swiglu=swiglu, out=out)


def _pre_unfused(x: torch.Tensor, nw: torch.Tensor, w: torch.Tensor, swiglu: bool, normed: torch.Tensor,
                 out: torch.Tensor) -> None:
    with ops.use("triton", op=("rms_norm", "gemm", "gemm_swiglu")):
        ops.rms_norm(x, nw, 1e-6, out=normed)
        if swiglu:
            ops.gemm_swiglu(normed, w, out=out)
        else:
            ops.gemm(normed, w, trans_b=True, out=out)


def bench_pre_norm(device: torch.device, smoke: bool) -> tuple[list[dict[str, Any]], bool]:
    """Part 2c: `rms_norm_gemm` against `rms_norm` then the projection per call (graph replay); the outputs compared
    once."""
    rows, ok = [], True
    shapes = {"tiny": (48, 64, False), "tiny SwiGLU": (48, 32, True)} if smoke else PRE_NORM_SHAPES
    for name, (k, n, swiglu) in shapes.items():
        for m in (1, 16):
            gen = torch.Generator(device=device).manual_seed(m * n + k + 2)
            w_rows = 2 * n if swiglu else n
            count = _copies(w_rows * k * 2, smoke)
            bf16 = torch.bfloat16
            weights = [torch.randn(w_rows, k, generator=gen, device=device, dtype=bf16) * k**-0.5
                       for _ in range(count)]
            x = torch.randn(m, k, generator=gen, device=device, dtype=bf16)
            nw = torch.randn(k, generator=gen, device=device, dtype=bf16) * 0.1 + 1
            normed = torch.empty(m, k, device=device, dtype=bf16)
            out_f, out_u = (torch.full((m, n), float("nan"), device=device, dtype=bf16) for _ in range(2))
            _pre_fused(x, nw, weights[0], swiglu, out_f)
            _pre_unfused(x, nw, weights[0], swiglu, normed, out_u)
            ok &= _close(out_f, out_u)
            if smoke:
                continue
            fused = [lambda w=w, a=(x, nw, swiglu, out_f): _pre_fused(a[0], a[1], w, *a[2:]) for w in weights]
            unfused = [lambda w=w, a=(x, nw, swiglu, normed, out_u): _pre_unfused(a[0], a[1], w, *a[2:])
                       for w in weights]
            t_fused, t_unfused = graph_time(fused, device), graph_time(unfused, device)
            rows.append({"shape": name, "M": m, "N": n, "K": k, "fused_us": t_fused * 1e6,
                         "unfused_us": t_unfused * 1e6, "speedup": t_unfused / t_fused})
    return rows, ok


def _paged_case(batch: int, ctx: int, hq: int, hkv: int, device: torch.device, gen: torch.Generator,
                block: int = 16, d: int = 128, capacity: int = 0) -> dict[str, torch.Tensor]:
    """A paged decode case: block tables of `capacity` keys a sequence (at least `ctx`; the engine's are its max
    model length), the context in its first blocks, the pages a random permutation."""
    blocks_per_seq = math.ceil(max(ctx, capacity) / block)
    num_blocks = batch * blocks_per_seq
    bf16 = torch.bfloat16
    k_cache = torch.randn(num_blocks, block, hkv, d, generator=gen, device=device, dtype=bf16)
    v_cache = torch.randn(num_blocks, block, hkv, d, generator=gen, device=device, dtype=bf16)
    table = torch.randperm(num_blocks, generator=gen, device=device).to(torch.int32).view(batch, blocks_per_seq)
    return {"q": torch.randn(batch, 1, hq, d, generator=gen, device=device, dtype=bf16),
            "k": torch.randn(batch, 1, hkv, d, generator=gen, device=device, dtype=bf16),
            "v": torch.randn(batch, 1, hkv, d, generator=gen, device=device, dtype=bf16),
            "k_cache": k_cache, "v_cache": v_cache, "block_table": table,
            "cache_seqlens": torch.full((batch,), ctx - 1, dtype=torch.int32, device=device)}


def _dense(case: dict[str, torch.Tensor], ctx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The paged cache as dense ``[B, Hkv, ctx, D]`` K and V, the new token's k/v at the end."""
    out = []
    for name, new in (("k_cache", case["k"]), ("v_cache", case["v"])):
        cache = case[name][case["block_table"].long()].flatten(1, 2)[:, :ctx]  # [B, ctx, Hkv, D]
        cache[:, ctx - 1] = new[:, 0]
        out.append(cache.transpose(1, 2).contiguous())
    return out[0], out[1]


def _our_attention(c: dict[str, torch.Tensor]) -> torch.Tensor:
    with ops.use("triton", op="flash_attn_with_kvcache"):
        return ops.flash_attn_with_kvcache(c["q"], c["k_cache"], c["v_cache"], c["k"], c["v"],
                                           cache_seqlens=c["cache_seqlens"], block_table=c["block_table"],
                                           softmax_scale=128**-0.5, causal=True)


def _sdpa(c: dict[str, torch.Tensor], kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return F.scaled_dot_product_attention(c["q"].transpose(1, 2), kv[0], kv[1], scale=128**-0.5,
                                          enable_gqa=True).transpose(1, 2)


def bench_attention(device: torch.device, smoke: bool, copy_bw: float) -> tuple[list[dict[str, Any]], bool]:
    rows, ok = [], True
    cases = {"tiny": (2, 40, 4, 2)} if smoke else ATTENTION_CASES
    for name, (batch, ctx, hq, hkv) in cases.items():
        gen = torch.Generator(device=device).manual_seed(batch * ctx)
        kv_bytes = 2 * batch * ctx * hkv * 128 * 2
        paged = [_paged_case(batch, ctx, hq, hkv, device, gen) for _ in range(_copies(kv_bytes, smoke))]
        dense = [_dense(c, ctx) for c in paged]
        ok &= _close(_our_attention(paged[0]), _sdpa(paged[0], dense[0]))
        if smoke:
            continue
        t_ours = graph_time([lambda c=c: _our_attention(c) for c in paged], device)
        t_sdpa = graph_time([lambda c=c, kv=kv: _sdpa(c, kv) for c, kv in zip(paged, dense)], device)
        gbs = kv_bytes / t_ours / 1e9
        rows.append({"case": name, "kv_mb": kv_bytes / 1e6, "ours_us": t_ours * 1e6, "sdpa_dense_us": t_sdpa * 1e6,
                     "ours_gbs": gbs, "of_copy": gbs * 1e9 / copy_bw, "speedup": t_sdpa / t_ours})
    return rows, ok


def _decode_profile(engine: Any, batch: int, input_len: int) -> tuple[float, float, int, dict[str, list[float]]]:
    """(wall ms, device busy ms, kernels, kernel name -> its durations in us) of one steady decode step of `batch`
    sequences (profiled)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from infinilm import SamplingParams
    from infinilm.profiling import _busy_us

    gen = torch.Generator().manual_seed(5)
    for p in torch.randint(0, engine.config.vocab_size, (batch, input_len), generator=gen).tolist():
        engine.add_request(p, SamplingParams(max_new_tokens=8, ignore_eos=True))
    engine.step()  # prefill
    engine.step()
    engine.step()  # steady decode
    torch.cuda.synchronize(engine.device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        engine.step()
        torch.cuda.synchronize(engine.device)
        wall = (time.perf_counter() - start) * 1e3
    device_events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    kernels = sum(1 for e in device_events if not e.name.startswith(("Memcpy", "Memset")))
    busy = _busy_us([(e.time_range.start, e.time_range.end) for e in device_events]) / 1e3
    names: dict[str, list[float]] = {}
    for e in device_events:
        names.setdefault(e.name, []).append(e.time_range.end - e.time_range.start)
    while engine.has_work():
        engine.step()
    return wall, busy, kernels, names


def bench_engine(device: torch.device, smoke: bool, only: list[str] | None = None) -> list[dict[str, Any]]:
    """The engine rows of the models whose name contains one of `only` (all when None), built in turn in this
    process."""
    import gpu_infinilm
    import gpu_mamba2
    from infiniops_triton import _common as triton_common

    from infinilm import Engine, EngineOptions
    from infinilm.bench import run_bench

    rows = []
    qwen3 = gpu_infinilm.SMOKE if smoke else gpu_infinilm.QWEN3_0_6B
    mamba2 = gpu_mamba2.SMOKE if smoke else gpu_mamba2.MAMBA2_130M
    fused = {"add_norm": "fused"}  # the projections into the residual stream as gemm_add_rms_norm
    prologue = {"add_norm": "prologue"}  # each norm in the next projection's rms_norm_gemm, o/down with c
    models = (("qwen3-0.6b", gpu_infinilm, qwen3, (1, 32, 64), False, {}),
              ("mamba2-130m", gpu_mamba2, mamba2, (1,), False, {}),
              ("qwen3-0.6b, PDL", gpu_infinilm, qwen3, (1, 32), True, {}),
              ("qwen3-0.6b, fused add+norm", gpu_infinilm, qwen3, (1,), False, fused),
              ("mamba2-130m, fused add+norm", gpu_mamba2, mamba2, (1,), False, fused),
              ("qwen3-0.6b, prologue norm", gpu_infinilm, qwen3, (1, 32), False, prologue),
              ("mamba2-130m, prologue norm", gpu_mamba2, mamba2, (1,), False, prologue))
    names = {m[0] for m in models}  # a whole name picks that model alone; any other text, every name containing it
    for name, module, shape, batches, pdl, extra in models:
        if only and not any(o == name or (o not in names and o in name) for o in only):
            continue
        triton_common.PDL = pdl and not smoke  # programmatic dependent launch of the Triton kernels
        with tempfile.TemporaryDirectory() as tmp:
            module.build(Path(tmp), shape, str(device))
            begun = time.perf_counter()
            smoke_providers = ((None, "torch"),) if smoke else ()  # the interpreter is too slow for a whole model
            engine = Engine.from_pretrained(tmp, EngineOptions(device=str(device), dtype="bfloat16",
                                                               max_model_len=2048, max_num_seqs=max(batches),
                                                               providers=smoke_providers, **extra))
            build_s = time.perf_counter() - begun
            for batch in batches:
                result = run_bench(engine, batch, 128, 8 if smoke else 128, repeats=1 if smoke else 2)
                wall, busy, kernels, names = (_decode_profile(engine, batch, 128) if device.type == "cuda"
                                              else (0.0, 0.0, 0, {}))
                print(f"\n{name} batch {batch}, one decode step's kernels (calls, total us):")
                for kernel, times in sorted(names.items(), key=lambda kv: -sum(kv[1])):
                    print(f"  {len(times):4d} {sum(times):9.1f}  {kernel[:110]}")
                layers = engine.config.num_layers
                rows.append({"model": name, "batch": batch, "decode_tok_s": result.decode_tokens_per_s,
                             "step_p50_ms": result.as_dict()["decode_step"]["p50_ms"],
                             "profiled_wall_ms": wall, "gpu_busy_ms": busy, "kernels": kernels,
                             "kernels_per_layer": kernels / layers, "graphs": engine.graph_status,
                             "build_s": build_s})
            engine.close()
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(none)"
    keys = [k for k in rows[0] if k != "graphs"]
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (no timing): the script itself")
    parser.add_argument("--part", action="append", choices=("gemm", "add_norm", "pre_norm", "attention", "engine"))
    parser.add_argument("--model", action="append", metavar="NAME",
                        help="engine part: only model NAME (qwen3-0.6b, mamba2-130m, 'qwen3-0.6b, PDL'), or those "
                             "whose name contains it (repeatable); a model alone in its process: its host-bound "
                             "rows unmixed")
    json_option(parser)
    args = parser.parse_args(argv)
    parts = args.part or ["gemm", "add_norm", "pre_norm", "attention", "engine"]
    if not args.smoke and not torch.cuda.is_available():
        print("gpu_decode.py needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.smoke else "cuda")
    if args.smoke:  # the Triton kernels on the CPU, as CI runs them
        import os

        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("INFINIOPS_TRITON_INTERPRET_CPU", "1")
        ops.reload()
    copy_bw = 1.0 if args.smoke else copy_bandwidth(device)
    print(f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}; torch {torch.__version__}; "
          f"copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write)", flush=True)
    ok, records = True, []
    if "gemm" in parts:
        rows, good = bench_gemm(device, args.smoke, copy_bw)
        ok &= good
        print(f"\n### decode Gemm, bf16, graph replay (outputs {'match' if good else 'DIFFER'})\n\n{_table(rows)}",
              flush=True)
        records += [{"part": "gemm", **r} for r in rows]
    if "add_norm" in parts:
        rows, good = bench_add_norm(device, args.smoke)
        ok &= good
        print(f"\n### projection + residual add + RMSNorm, bf16, graph replay (outputs {'match' if good else 'DIFFER'})"
              f"\n\n{_table(rows)}", flush=True)
        records += [{"part": "add_norm", **r} for r in rows]
    if "pre_norm" in parts:
        rows, good = bench_pre_norm(device, args.smoke)
        ok &= good
        print(f"\n### RMSNorm + projection, bf16, graph replay (outputs {'match' if good else 'DIFFER'})"
              f"\n\n{_table(rows)}", flush=True)
        records += [{"part": "pre_norm", **r} for r in rows]
    if "attention" in parts:
        rows, good = bench_attention(device, args.smoke, copy_bw)
        ok &= good
        print(f"\n### paged decode attention, bf16, graph replay (outputs {'match' if good else 'DIFFER'})\n\n"
              f"{_table(rows)}", flush=True)
        records += [{"part": "attention", **r} for r in rows]
    if "engine" in parts:
        rows = bench_engine(device, args.smoke, args.model)
        print(f"\n### engine decode\n\n{_table(rows)}", flush=True)
        for r in rows:
            print(f"{r['model']} batch {r['batch']}: {r['graphs']}")
        records += [{"part": "engine", **r} for r in rows]
    if args.json:
        env = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
               "date": time.strftime("%Y-%m-%d"), "copy_bandwidth": copy_bw}
        args.json.write_text(json.dumps([{**r, **env} for r in records], indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Every operator at realistic LLM sizes on the GPU, every provider side by side, and the per-family targets.

    python3 benchmarks/ops.py [--write benchmarks/RESULTS.md] [--json FILE] [--skip-families]

1. The ceilings, measured in this run: device-to-device copy bandwidth (bytes read + written) and bf16
   ``torch.matmul`` TFLOP/s at 8192^3.
2. Providers side by side (bf16): each operator through its public function under ``use(provider)`` for
   torch, triton and cupy (a provider that does not serve the problem is shown as gated), index checks
   off; median of ``triton.testing.do_bench``; GB/s (bytes read + written once) or TFLOP/s; the ratio of
   each provider to the best of the *others* measured in the same run.
3. The per-family target tables (benchmarks/gpu_dense.py, gpu_attention.py, gpu_ssm.py), unless
   ``--skip-families``.

``--write`` saves the tables with the date, device and versions; ``--json`` the measurements of every
table as records (benchmarks/_common.py's `record`) for benchmarks/plots.py.
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import infiniops_py as ops

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)  # benchmarks/_common.py and the family scripts
from _common import (
    Record,
    copy_bandwidth_gbs,
    json_option,
    matmul_tflops,
    median_ms,
    perf_records,
    record,
    write_records,
)

PROVIDERS = ("torch", "triton", "cupy")
BF16 = torch.bfloat16


@dataclass
class Bench:
    """One operator call: `amount` bytes (metric GB/s) or flops (TFLOP/s) per call."""

    name: str
    op: str
    call: Callable[[], Any]
    amount: float
    metric: str


def _randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=BF16) * scale


def ceilings() -> tuple[float, float]:
    """Copy GB/s (read + write, random source bytes) and bf16 matmul TFLOP/s at 8192^3, measured now."""
    return copy_bandwidth_gbs(fill=True), matmul_tflops()


def benches() -> list[Bench]:
    """The cases: sizes of a Llama-8B-class layer for dense ops, Mamba-2-130m for the SSM ones."""
    out: list[Bench] = []
    e = 2  # bytes per bf16 element

    m = n = k = 8192
    a, w, bias = _randn(m, k), _randn(n, k, scale=k**-0.5), _randn(n)
    out.append(Bench("gemm 8192^3 linear + bias", "gemm", lambda: ops.gemm(a, w, bias=bias, trans_b=True),
                     2 * m * n * k, "TFLOP/s"))

    x, y = _randn(16384, 8192), _randn(16384, 8192)
    out.append(Bench("add [16384, 8192]", "add", lambda: ops.add(x, y), 3 * x.numel() * e, "GB/s"))

    h = _randn(32768, 4096)
    nw = 1 + 0.1 * _randn(4096)
    out.append(Bench("rms_norm [32768, 4096]", "rms_norm", lambda: ops.rms_norm(h, nw, 1e-6),
                     2 * h.numel() * e, "GB/s"))
    r = _randn(32768, 4096)
    out.append(Bench("fused_add_rms_norm [32768, 4096]", "fused_add_rms_norm",
                     lambda: ops.fused_add_rms_norm(h, r, nw, 1e-6), 4 * h.numel() * e, "GB/s"))

    t, hq, hkv, d = 24576, 32, 8, 128
    qkv = _randn(t, (hq + 2 * hkv) * d)
    qw, kw = 1 + 0.1 * _randn(d), 1 + 0.1 * _randn(d)
    out.append(Bench(f"fused_qk_norm T{t} {hq}/{hkv}h D{d}", "fused_qk_norm",
                     lambda: ops.fused_qk_norm(qkv, qw, kw, num_q_heads=hq, num_kv_heads=hkv, head_dim=d),
                     2 * t * (hq + hkv) * d * e, "GB/s"))

    t, bs = 65536, 16
    key, value = _randn(t, hkv, d), _randn(t, hkv, d)
    blocks = t // bs + 64
    kc = torch.empty(blocks, bs, hkv, d, device="cuda", dtype=BF16)
    vc = torch.empty_like(kc)
    slots = torch.randperm(blocks * bs, device="cuda")[:t]
    out.append(Bench(f"reshape_and_cache_flash T{t} {hkv}h D{d} bs{bs}", "reshape_and_cache_flash",
                     lambda: ops.reshape_and_cache_flash(key, value, kc, vc, slots), 4 * t * hkv * d * e, "GB/s"))

    b, s = 4, 4096
    q, kk, vv = _randn(b * s, 32, d), _randn(b * s, 32, d), _randn(b * s, 32, d)
    cu = torch.arange(0, (b + 1) * s, s, device="cuda", dtype=torch.int32)
    out.append(Bench(f"flash_attn_varlen causal {b}x{s} 32h D{d}", "flash_attn_varlen",
                     lambda: ops.flash_attn_varlen(q, kk, vv, cu, cu, s, s, causal=True),
                     4 * b * 32 * s * s * d / 2, "TFLOP/s"))

    batch, ctx, bs = 64, 4096, 16
    per = ctx // bs
    kcache = _randn(batch * per, bs, hkv, d)
    vcache = _randn(batch * per, bs, hkv, d)
    table = torch.randperm(batch * per, device="cuda", dtype=torch.int32).view(batch, per)
    lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
    qd = _randn(batch, 1, hq, d)
    out.append(Bench(f"flash_attn_with_kvcache B{batch} {hq}/{hkv}h ctx{ctx} bs{bs}", "flash_attn_with_kvcache",
                     lambda: ops.flash_attn_with_kvcache(qd, kcache, vcache, cache_seqlens=lens, block_table=table),
                     2 * batch * ctx * hkv * d * e, "GB/s"))

    bx, dim, length, width = 8, 4096, 4096, 4
    cx, cw, cb = _randn(bx, dim, length), _randn(dim, width, scale=0.5), _randn(dim)
    out.append(Bench(f"causal_conv1d B{bx} D{dim} L{length} W{width}", "causal_conv1d",
                     lambda: ops.causal_conv1d(cx, cw, cb, activation="silu"), 2 * cx.numel() * e, "GB/s"))

    conv_dim, slots_n = 1792, 256
    ux = _randn(64, conv_dim)
    ustate = _randn(slots_n, conv_dim, width - 1)
    uidx = torch.randperm(slots_n, device="cuda", dtype=torch.int32)[:64]
    cw2, cb2 = _randn(conv_dim, width, scale=0.5), _randn(conv_dim)
    out.append(Bench(f"causal_conv1d_update B64 D{conv_dim} W{width}", "causal_conv1d_update",
                     lambda: ops.causal_conv1d_update(ux, ustate, cw2, cb2, activation="silu",
                                                      conv_state_indices=uidx),
                     (2 * 64 * conv_dim * (width - 1) + 2 * 64 * conv_dim) * e, "GB/s"))

    hh, p, nn, g = 24, 64, 128, 1
    bt, ln = 8, 2048
    sx, sdt = _randn(bt, ln, hh, p), _randn(bt, ln, hh, scale=0.5)
    sa = -torch.rand(hh, device="cuda", dtype=torch.float32) - 0.5
    sb, sc = _randn(bt, ln, g, nn), _randn(bt, ln, g, nn)
    sd, sbias = torch.randn(hh, device="cuda"), torch.randn(hh, device="cuda") * 0.1
    out.append(Bench(f"selective_scan {bt}x{ln} H{hh} P{p} N{nn}", "selective_scan",
                     lambda: ops.selective_scan(sx, sdt, sa, sb, sc, D=sd, dt_bias=sbias, dt_softplus=True),
                     2 * sx.numel() * e + sdt.numel() * e + 2 * sb.numel() * e, "GB/s"))

    state = torch.randn(256, hh, p, nn, device="cuda", dtype=torch.float32)
    ix, idt = _randn(64, hh, p), _randn(64, hh, scale=0.5)
    ib, ic = _randn(64, g, nn), _randn(64, g, nn)
    sidx = torch.randperm(256, device="cuda", dtype=torch.int32)[:64]
    out.append(Bench("selective_state_update B64 H24 P64 N128 fp32 state", "selective_state_update",
                     lambda: ops.selective_state_update(state, ix, idt, sa, ib, ic, D=sd, dt_bias=sbias,
                                                        dt_softplus=True, state_batch_indices=sidx),
                     2 * 64 * hh * p * nn * 4, "GB/s"))
    return out


def measure(bench: Bench) -> dict[str, float | str]:
    """Per provider: the rate, or why it was not measured."""
    row: dict[str, float | str] = {}
    for provider in PROVIDERS:
        with ops.use(provider), ops.unchecked_indices():
            try:
                ms = median_ms(bench.call)
            except ops.GateError as err:
                first = next((c for c in err.candidates if c.provider == provider and c.rejections), None)
                row[provider] = "gated: " + (str(first.rejections[0]) if first else "not served")
                continue
            except Exception as err:  # a crash is a result too: show it, go on
                row[provider] = f"error: {type(err).__name__}: {err}"[:120]
                continue
        scale = 1e6 if bench.metric == "GB/s" else 1e9
        row[provider] = bench.amount / ms / scale
    return row


def side_by_side(rows: list[tuple[Bench, dict[str, float | str]]], copy: float, mm: float) -> str:
    lines = ["| operator (bf16) | metric | torch | triton | cupy | roofline of best | triton vs best other |",
             "|---|---|---|---|---|---|---|"]
    for bench, row in rows:
        rates = {p: v for p, v in row.items() if isinstance(v, float)}
        best = max(rates.values(), default=math.nan)
        ceiling = copy if bench.metric == "GB/s" else mm
        others = [v for p, v in rates.items() if p != "triton"]
        vs = f"{rates['triton'] / max(others):.2f}x" if "triton" in rates and others else "-"
        cells = [f"{row[p]:.0f}" if isinstance(row[p], float) else str(row[p]) for p in PROVIDERS]
        lines.append(f"| {bench.name} | {bench.metric} | " + " | ".join(cells)
                     + f" | {best / ceiling:.0%} | {vs} |")
    return "\n".join(lines)


def side_by_side_records(rows: list[tuple[Bench, dict[str, float | str]]], copy: float, mm: float) -> list[Record]:
    """One record per operator and provider of the side-by-side table: the time per call, the rate and its
    fraction of the run's ceiling (copy bandwidth for GB/s, bf16 matmul for TFLOP/s), or the reason it has
    none (a gate's, a crash's) in its note."""
    out = []
    for bench, row in rows:
        scale = 1e6 if bench.metric == "GB/s" else 1e9
        ceiling = copy if bench.metric == "GB/s" else mm
        for provider, v in row.items():
            rate = v if isinstance(v, float) else None
            out.append(record("operator", "benchmarks/ops.py", bench.op, provider, bench.name,
                              ms=bench.amount / rate / scale if rate else None, rate=rate, metric=bench.metric,
                              roofline=rate / ceiling if rate else None, note="" if rate else str(v)))
    return out


def families(skip: bool, records: list[Record] | None = None) -> list[str]:
    """Run the per-family target benchmarks; returns their formatted tables (and appends their timings'
    records to `records`)."""
    if skip:
        return []
    import importlib

    tables = []
    for name in ("gpu_dense", "gpu_attention", "gpu_ssm"):
        module = importlib.import_module(name)
        results: list[dict[str, Any]] = []
        try:
            module.run(results)
        except Exception as err:  # keep the other families' numbers
            tables.append(f"### {name}\n\ncrashed: {type(err).__name__}: {err}")
            continue
        tables.append(f"### {name}\n\n```\n{module.format_table(results)}\n```")
        if records is not None:
            records.extend(perf_records(results, f"benchmarks/{name}.py"))
    return tables


def header() -> str:
    import triton

    try:
        import cupy

        cupy_version = cupy.__version__
    except ImportError:
        cupy_version = "not installed"
    return (f"Date: {datetime.date.today().isoformat()}. Device: {torch.cuda.get_device_name()}. "
            f"torch {torch.__version__}, triton {triton.__version__}, cupy {cupy_version}, "
            f"Python {sys.version.split()[0]}.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="write the tables (markdown) to this file")
    parser.add_argument("--skip-families", action="store_true", help="only the side-by-side table")
    json_option(parser)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/ops.py needs a CUDA device", file=sys.stderr)
        return 2
    copy, mm = ceilings()
    rows = []
    for bench in benches():
        rows.append((bench, measure(bench)))
        print(bench.name, rows[-1][1], flush=True)
    torch.cuda.empty_cache()
    records = side_by_side_records(rows, copy, mm)
    tables = families(args.skip_families, records)
    text = "\n\n".join([
        "## Operators, providers side by side",
        header(),
        f"Measured ceilings: copy {copy:.0f} GB/s, bf16 matmul {mm:.0f} TFLOP/s.",
        side_by_side(rows, copy, mm),
        *tables,
    ])
    print("\n" + text)
    if args.write:
        args.write.write_text(text + "\n")
    if args.json:
        write_records(args.json, records, "cuda")
    return 0


if __name__ == "__main__":
    sys.exit(main())

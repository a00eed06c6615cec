"""Sweep of the Triton paged decode attention's launch settings on the H200 (issues 23 and 26), in under 4 min.

    python3 -m pip install -q --no-deps --no-build-isolation -e . -e providers/torch -e providers/triton
    python3 benchmarks/gpu_sweep_decode.py [--json FILE] [--case NAME ...]   # one table per case, best marked *
    python3 benchmarks/gpu_sweep_decode.py --smoke   # the CPU under TRITON_INTERPRET=1, tiny sizes, no timing

Each case (bf16, D 128, block size 16, one query appending its new k/v, as the engine's decode step): the Triton
``flash_attn_with_kvcache`` with each of `VARIANTS` (a ``config`` of the launcher:
`infiniops_triton.flash_attn.DECODE_KEYS`; ``defaults`` is the launcher as committed, its `DECODE_DEFAULTS`
table; every other variant runs with that table emptied, so exactly its own settings apply) against SDPA on a
dense ``[B, Hkv, ctx, D]`` cache of the same bytes (GQA):

1. check: the output against SDPA in float64 on the dense cache, the bf16 ``flash_attn_with_kvcache`` rule of
   infiniops_py/testing/tolerances.py (the bf16 SDPA as the low-precision run), and the new k/v found in the
   cache; PASS/FAIL (a variant that fails to compile or run is a FAIL line, the sweep goes on);
2. time: graph replay of calls over distinct caches (together past the L2 cache), per call, beside SDPA dense
   timed the same way (`gpu_decode.graph_time`); GB/s of the K/V bytes read, ratio = SDPA us / ours us.

The last lines give each case's fastest correct variant as a `DECODE_DEFAULTS` settings dict, with its
programs (batch x kv heads) and cache capacity, to copy into the table. Exit status 1 when a variant failed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from _common import json_option
from gpu_decode import _copies, _dense, _paged_case, graph_time

import infiniops_py as ops
from infiniops_py.testing.compare import compare
from infiniops_py.testing.tolerances import tolerance

CASES = {  # name: (batch, context incl. the new token, Hq, Hkv)
    "qwen3-0.6b, B 1, ctx 130": (1, 130, 16, 8), "qwen3-0.6b, B 32, ctx 130": (32, 130, 16, 8),
    "B 8, ctx 1024, 16/8 heads": (8, 1024, 16, 8), "B 1, ctx 4096, 16/8 heads": (1, 4096, 16, 8),
    "B 64, ctx 4096, 32/8 heads": (64, 4096, 32, 8),
}
SMOKE_CASES = {"tiny B 1, ctx 40": (1, 40, 4, 2), "tiny B 2, ctx 70": (2, 70, 4, 2)}
SMOKE_HEAD_DIM = 32
HEAD_DIM = 128


def _kernel(bn: int, warps: int, stages: int) -> dict[str, int]:
    return {"BLOCK_N": bn, "num_warps": warps, "num_stages": stages}


def _short(bn: int, warps: int, stages: int, waves: int, **more: Any) -> dict[str, Any]:
    """Short contexts over more programs: a split may take one block of `bn` keys."""
    return {**_kernel(bn, warps, stages), "min_split_keys": bn, "min_split_blocks": 1, "split_waves": waves, **more}


def _long(bn: int, warps: int, stages: int, waves: int, keys: int = 256) -> dict[str, Any]:
    """Long contexts: splits of `keys` keys at least, aiming at `waves` programs per SM (132 on the H200)."""
    return {**_kernel(bn, warps, stages), "min_split_keys": keys, "min_split_blocks": max(1, keys // bn),
            "split_waves": waves}


def _variants() -> dict[str, dict[str, Any] | None]:
    v: dict[str, dict[str, Any] | None] = {
        "defaults": None,  # DECODE_DEFAULTS as committed
        "autotuned": {},  # the autotuned kernel, the module-level split rules (main before this sweep)
        "autotuned new_first": {"new_first": True},
        "autotuned separate combine": {"fused": False},
    }
    for bn, warps, stages, waves in ((16, 4, 2, 2), (16, 4, 2, 4), (32, 4, 2, 2), (32, 4, 2, 4), (32, 4, 3, 4),
                                     (64, 4, 3, 4)):
        v[f"short {bn}/{warps}w/{stages}s x{waves}"] = _short(bn, warps, stages, waves)
    v["short 32/4w/2s x4 new_first"] = _short(32, 4, 2, 4, new_first=True)
    v["short 16/4w/2s x4 new_first"] = _short(16, 4, 2, 4, new_first=True)
    v["short 32/4w/2s x4 separate combine"] = _short(32, 4, 2, 4, fused=False)
    v["short 32/4w/2s x4 new_first maxnreg 128"] = _short(32, 4, 2, 4, new_first=True, maxnreg=128)
    v["short 32/4w/3s x4 maxnreg 128"] = _short(32, 4, 3, 4, maxnreg=128)  # 154 registers without the limit
    v["short 32/2w/2s x4"] = _short(32, 2, 2, 4)
    # 64/4w: ~210 registers a thread (a limit of 168 spills), 64/8w: 126
    for bn, warps, stages in ((64, 4, 5), (128, 4, 4), (128, 8, 3), (64, 8, 3)):
        for waves in (2, 4, 8):
            v[f"long {bn}/{warps}w/{stages}s x{waves}"] = _long(bn, warps, stages, waves)
    v["long 64/8w/4s x4"] = _long(64, 8, 4, 4)
    v["long 64/8w/3s x4 128 keys"] = _long(64, 8, 3, 4, keys=128)
    v["long 128/8w/3s x4 128 keys"] = _long(128, 8, 3, 4, keys=128)
    first = ("defaults", "autotuned", "short 32/4w/2s x4", "short 16/4w/2s x4", "short 32/4w/2s x4 new_first",
             "long 64/8w/3s x4", "long 64/8w/3s x8", "long 128/8w/3s x4", "long 64/4w/5s x4")
    return {k: v[k] for k in (*first, *(k for k in v if k not in first))}  # past --budget the last are skipped


VARIANTS = _variants()


def _sdpa(c: dict[str, torch.Tensor], kv: tuple[torch.Tensor, torch.Tensor], dtype: torch.dtype | None = None,
          ) -> torch.Tensor:
    q, k, v = c["q"].transpose(1, 2), kv[0], kv[1]
    if dtype is not None:
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    return F.scaled_dot_product_attention(q, k, v, scale=q.shape[-1] ** -0.5, enable_gqa=True).transpose(1, 2)


def _ours(c: dict[str, torch.Tensor], out: torch.Tensor, config: dict[str, Any] | None) -> torch.Tensor:
    from infiniops_triton import flash_attn as tfa

    return tfa.flash_attn_with_kvcache(c["q"], c["k_cache"], c["v_cache"], c["cache_seqlens"], c["block_table"],
                                       c["k"], c["v"], c["q"].shape[-1] ** -0.5, True, (-1, -1), 0.0, out,
                                       config=config)


class _Settings:
    """Within: `DECODE_DEFAULTS` emptied for a variant with its own settings (None: the table as committed)."""

    def __init__(self, config: dict[str, Any] | None) -> None:
        self.config = config

    def __enter__(self) -> None:
        from infiniops_triton import flash_attn as tfa

        self.saved = list(tfa.DECODE_DEFAULTS)
        if self.config is not None:
            tfa.DECODE_DEFAULTS[:] = []

    def __exit__(self, *exc: object) -> None:
        from infiniops_triton import flash_attn as tfa

        tfa.DECODE_DEFAULTS[:] = self.saved


def _appended(c: dict[str, torch.Tensor], ctx: int) -> bool:
    """The new k/v of every sequence sit at position ctx - 1 of its pages."""
    block = c["k_cache"].shape[1]
    pages = c["block_table"][:, (ctx - 1) // block].long()
    return all(bool(torch.equal(c[name][pages, (ctx - 1) % block], c[new][:, 0]))
               for name, new in (("k_cache", "k"), ("v_cache", "v")))


def _measure(paged: list[dict[str, torch.Tensor]], outs: list[torch.Tensor], ref: torch.Tensor, low: torch.Tensor,
             ctx: int, config: dict[str, Any] | None, device: torch.device, smoke: bool) -> dict[str, Any]:
    """check, worst, note and us of one variant: the check on the first copy (out poisoned first), then the
    graph replay over all copies; a variant that fails to compile or run is a FAIL, the sweep goes on."""
    tol = tolerance("flash_attn_with_kvcache", "bfloat16")
    try:
        with _Settings(config):
            outs[0].fill_(float("nan"))
            _ours(paged[0], outs[0], config)
            worst, failure = compare("result", outs[0], ref, tol, low=low)
            if failure is None and not _appended(paged[0], ctx):
                failure = "the new k/v are not in the cache"
            us = math.nan if smoke else 1e6 * graph_time(
                [lambda c=c, o=o, s=config: _ours(c, o, s) for c, o in zip(paged, outs)], device)
    except Exception as e:
        return {"check": "FAIL", "worst": math.inf, "us": math.nan, "note": f"{type(e).__name__}: {e}"[:200]}
    return {"check": "PASS" if failure is None else "FAIL", "worst": worst, "us": us, "note": failure or ""}


def prepare_case(shape: tuple[int, int, int, int], device: torch.device, smoke: bool, capacity: int = 0,
                 ) -> dict[str, Any]:
    """The case's copies (paged and dense; `capacity`: keys of each sequence's block table, at least the
    context), the float64 and bf16 SDPA outputs, SDPA's graph-replay time (nan under --smoke)."""
    batch, ctx, hq, hkv = shape
    d = SMOKE_HEAD_DIM if smoke else HEAD_DIM
    gen = torch.Generator(device=device).manual_seed(batch * ctx)
    kv_bytes = 2 * batch * ctx * hkv * d * 2
    copies = _copies(max(kv_bytes, 2 * batch * max(capacity, ctx) * hkv * d * 2 // 8), smoke)  # memory bounded
    paged = [_paged_case(batch, ctx, hq, hkv, device, gen, d=d, capacity=capacity) for _ in range(copies)]
    dense = [_dense(c, ctx) for c in paged]
    t_sdpa = math.nan if smoke else graph_time([lambda c=c, kv=kv: _sdpa(c, kv) for c, kv in zip(paged, dense)],
                                               device)
    return {"paged": paged, "ref": _sdpa(paged[0], dense[0], torch.float64), "low": _sdpa(paged[0], dense[0]),
            "sdpa_us": t_sdpa * 1e6, "kv_bytes": kv_bytes, "ctx": ctx,
            "outs": [torch.empty_like(c["q"]) for c in paged]}


def run_variant(name: str, case: dict[str, Any], label: str, config: dict[str, Any] | None, device: torch.device,
                smoke: bool, skip: bool = False) -> dict[str, Any]:
    """One row: the variant `label` on the prepared case (a SKIP row when `skip`)."""
    row: dict[str, Any] = {"case": name, "variant": label, "config": config, "sdpa_us": case["sdpa_us"]}
    if skip:
        row.update(check="SKIP", worst=math.nan, us=math.nan, note="past --budget")
    else:
        row.update(_measure(case["paged"], case["outs"], case["ref"], case["low"], case["ctx"], config, device,
                            smoke))
    row["gbs"] = case["kv_bytes"] / row["us"] / 1e3
    row["ratio"] = row["sdpa_us"] / row["us"]
    return row


def best_index(rows: list[dict[str, Any]]) -> int | None:
    """The fastest variant that passed its check (none under --smoke: nothing is timed)."""
    ok = [i for i, r in enumerate(rows) if r["check"] == "PASS" and math.isfinite(r["us"])]
    return min(ok, key=lambda i: rows[i]["us"]) if ok else None


def format_case(name: str, shape: tuple[int, int, int, int], rows: list[dict[str, Any]]) -> str:
    best = best_index(rows)
    batch, ctx, hq, hkv = shape
    lines = [f"\n### {name} (B {batch}, ctx {ctx}, {hq}/{hkv} heads; SDPA dense {rows[0]['sdpa_us']:.1f} us)\n",
             "| | variant | check | max err | us | GB/s | SDPA/ours |", "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows):
        note = f" {r['note'][:90]}" if r["note"] else ""
        lines.append(f"| {'*' if i == best else ''} | {r['variant']} | {r['check']}{note} | {r['worst']:.3g} | "
                     f"{r['us']:.1f} | {r['gbs']:.0f} | {r['ratio']:.2f} |")
    return "\n".join(lines)


def winners(results: dict[str, list[dict[str, Any]]], cases: dict[str, tuple[int, int, int, int]],
            capacity: int = 0) -> str:
    """Each case's fastest correct variant as a `DECODE_DEFAULTS` row's bounds and settings."""
    lines = ["\n### winners (DECODE_DEFAULTS rows: (most programs, most capacity, settings); "
             "programs = B x Hkv for one query of <= 64 GQA rows, capacity = blocks x 16)\n"]
    for name, rows in results.items():
        batch, ctx, _, hkv = cases[name]
        best = best_index(rows)
        if best is None:
            lines.append(f"{name}: no variant timed and correct")
            continue
        r = rows[best]
        keys = math.ceil(max(capacity, ctx) / 16) * 16
        lines.append(f"{name}: programs {batch * hkv}, capacity {keys}: {r['variant']} -> "
                     f"{r['config'] if r['config'] is not None else 'the committed defaults'} "
                     f"({r['us']:.1f} us, {r['ratio']:.2f}x SDPA)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (no timing): the script itself")
    parser.add_argument("--case", action="append", help="run only these cases (names of CASES)")
    parser.add_argument("--variant", action="append", help="run only these variants (names of VARIANTS)")
    parser.add_argument("--budget", type=float, default=200.0, metavar="S",
                        help="seconds after which the variants left are skipped (SKIP rows), 200 by default")
    parser.add_argument("--capacity", type=int, default=0, metavar="KEYS",
                        help="block tables of KEYS keys a sequence, as the engine's (default: the context's)")
    json_option(parser)
    args = parser.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("gpu_sweep_decode.py needs a CUDA device (or --smoke)", file=sys.stderr)
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
    prepared = {name: prepare_case(shape, device, args.smoke, args.capacity) for name, shape in cases.items()}
    print(f"cases ready ({time.perf_counter() - began:.0f} s)", flush=True)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in cases}
    for label, config in variants.items():  # variant-major: past --budget the same variants are skipped everywhere
        skip = time.perf_counter() - began > args.budget
        for name in cases:
            results[name].append(run_variant(name, prepared[name], label, config, device, args.smoke, skip))
        line = "  ".join(f"{results[n][-1]['check']} {results[n][-1]['us']:.1f}" for n in cases)
        print(f"[{time.perf_counter() - began:4.0f} s] {label}: {line} us", flush=True)  # progress, case order
    ok = all(r["check"] != "FAIL" for rows in results.values() for r in rows)
    for name, shape in cases.items():
        print(format_case(name, shape, results[name]), flush=True)
    print(winners(results, cases, args.capacity))
    skipped = sum(r["check"] == "SKIP" for rows in results.values() for r in rows)
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

"""Sweep of the Triton causal_conv1d channel-last tile on the H200 (target: >= 85% of copy bandwidth), in under 90 s.

    python benchmarks/gpu_sweep_conv.py       # checks, timings, then the table (best tile marked *)
    python benchmarks/gpu_sweep_conv.py --json FILE   # also each variant's time and rate as records

Shape: bf16 x ``[8, 4096, 4096]`` (256 MB), W=4, bias and SiLU, no states: channel-last (a transposed view
of a contiguous ``[B, L, D]`` tensor, as causal-conv1d's channel-last path and benchmarks/gpu_dense.py) for
each `ChannelLastTile` in `VARIANTS` (forced through ``causal_conv1d.CHANNEL_LAST_TILE``), the launcher's
default tile, and channel-first once (its autotuned kernel). Each variant:

1. correctness against ``torch.nn.functional.conv1d`` in fp32 (one reference: both layouts hold the same
   values), the bf16 causal_conv1d tolerance of infiniops_py/testing/tolerances.py, PASS/FAIL;
2. ``triton.testing.do_bench`` median; GB/s of x read once + out written once, as a share of the copy
   bandwidth measured in this run (a 2 GiB device-to-device copy, read + write bytes), against the torch
   provider's time on the same buffers (``infiniops_py.use("torch")``).

The target: >= 85% of the copy bandwidth and faster than the torch provider. Only 7 channel-last
kernels compile, one per channels/warps pair (the time rows of a tile set the grid, not a compile-time
constant). On the H200 the best tile was 128x512/4w at 86% of copy, now the launcher's default; a tile that
loaded the next 8 rows while the current 8 computed lost on every shape (64-83%) and was dropped.
`run(results, ...)` is importable; ``small=True`` shrinks the shape for the CPU test (Triton interpreter, a
stand-in timer).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import infiniops_py
from infiniops_py.testing.compare import compare
from infiniops_py.testing.tolerances import tolerance

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)  # benchmarks/_common.py, also when a test loads this file by its path
from _common import Record, Timer, bench_main, copy_bandwidth_gbs, median_ms, record, resolved_call
from infiniops_triton import causal_conv1d as triton_conv
from infiniops_triton.causal_conv1d import ChannelLastTile

BANDWIDTH_TARGET = 0.85
WIDTH = 4


def _tile(rows: int, channels: int, warps: int) -> ChannelLastTile:
    return ChannelLastTile(rows, channels, warps, min_programs_per_sm=0.0)  # exactly this tile


# rows x channels / warps; channels / (32 * warps) channels per thread: 8 = 16-byte bf16 vectors, 4 = 8-byte
VARIANTS: tuple[ChannelLastTile, ...] = (
    _tile(8, 1024, 4),  # the former kernel's tile: 8 rows, the W-1 halo rows reloaded by every program
    _tile(16, 1024, 4), _tile(32, 1024, 4), _tile(64, 1024, 4), _tile(128, 1024, 4), _tile(256, 1024, 4),
    _tile(512, 1024, 4),
    _tile(64, 512, 2), _tile(128, 512, 2), _tile(256, 512, 2),
    _tile(64, 512, 4), _tile(128, 512, 4),
    _tile(64, 2048, 8), _tile(128, 2048, 8),
    _tile(32, 4096, 16), _tile(64, 4096, 16),  # whole rows (8 KB) per program, one program per SM
    _tile(64, 256, 1), _tile(128, 256, 1),
    _tile(64, 1024, 8), _tile(128, 1024, 8),
)


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """fp32 ``silu(causal depthwise conv1d(x) + bias)`` of ``x [B, D, L]`` with ``weight [D, W]``, ``[B, D, L]``."""
    dim, width = weight.shape
    y = F.conv1d(x.float(), weight.float().unsqueeze(1), bias.float(), padding=width - 1, groups=dim)
    return F.silu(y[..., : x.shape[-1]])


def _name(tile: ChannelLastTile | None) -> str:
    return "autotuned" if tile is None else f"{tile.rows}x{tile.channels}/{tile.warps}w"


def run(results: list[dict[str, Any]], device: str = "cuda", *, timer: Timer = median_ms,
        small: bool = False) -> None:
    """Append one dict per variant (layout, tile, check, ms, GB/s, share of copy, vs torch) to `results`."""
    batch, dim, length = (1, 48, 20) if small else (8, 4096, 4096)
    gen = torch.Generator(device=device).manual_seed(0)
    x_cl = torch.randn(batch, length, dim, generator=gen, device=device).to(torch.bfloat16).transpose(1, 2)
    x_cf = x_cl.contiguous()  # the same values channel-first: one reference for both layouts
    weight = (torch.randn(dim, WIDTH, generator=gen, device=device) * WIDTH**-0.5).to(torch.bfloat16)
    bias = torch.randn(dim, generator=gen, device=device).to(torch.bfloat16)
    ref = reference(x_cf, weight, bias)
    tol = tolerance("causal_conv1d", "bfloat16")
    nbytes = 2 * x_cl.nbytes
    copy_gbs = copy_bandwidth_gbs(device, (1 << 20) if small else (2 << 30), timer)
    print(f"B{batch} D{dim} L{length} W{WIDTH} bf16 bias+silu, {nbytes / 1e6:.0f} MB moved; copy bandwidth "
          f"{copy_gbs:.0f} GB/s", flush=True)

    def calls(x: torch.Tensor, out: torch.Tensor, channel_last: bool) -> tuple[Any, Any]:
        problem = {"device_type": torch.device(device).type, "dtype": "bfloat16", "width": WIDTH, "has_bias": True,
                   "silu": True, "channel_last": channel_last, "has_seq_idx": False, "has_initial_states": False,
                   "return_final_states": False}
        return tuple(resolved_call(p, "causal_conv1d", problem, x, weight, bias, "silu", None, None, out, None)
                     for p in ("triton", "torch"))

    torch_ms: dict[bool, float] = {}
    for channel_last, tiles in ((True, (*VARIANTS, triton_conv.CHANNEL_LAST_TILE)), (False, (None,))):
        x = x_cl if channel_last else x_cf
        out = torch.empty_like(x)  # the input's layout
        tri, tor = calls(x, out, channel_last)
        torch_ms[channel_last] = timer(tor)
        for tile in tiles:
            default = tile is triton_conv.CHANNEL_LAST_TILE
            row: dict[str, Any] = {"layout": "channel-last" if channel_last else "channel-first",
                                   "tile": _name(tile) + (" (default)" if default else ""),
                                   "torch_ms": torch_ms[channel_last]}
            saved = triton_conv.CHANNEL_LAST_TILE
            try:
                if tile is not None:
                    triton_conv.CHANNEL_LAST_TILE = tile
                out.fill_(float("nan"))
                with infiniops_py.unchecked_indices():
                    tri()
                worst, failure = compare("result", out, ref, tol)
                row.update(check="PASS" if failure is None else "FAIL", worst=worst, note=failure or "")
                row["ms"] = timer(tri)
            except Exception as e:  # a variant that fails to compile or run is a FAIL line, the sweep goes on
                row.update(check="FAIL", worst=math.inf, ms=math.nan, note=f"{type(e).__name__}: {e}"[:200])
            finally:
                triton_conv.CHANNEL_LAST_TILE = saved
            row["gbs"] = nbytes / row["ms"] / 1e6
            row["copy"] = row["gbs"] / copy_gbs
            row["target"] = row["status"] = ("PASS" if row["check"] == "PASS" and row["copy"] >= BANDWIDTH_TARGET
                                             and row["ms"] < row["torch_ms"] else "MISS")
            results.append(row)
            print(_line(row), flush=True)


def _line(row: dict[str, Any], best: bool = False) -> str:
    return (f"{'*' if best else ' '} {row['layout']:<13} {row['tile']:<22} {row['check']:<4} "
            f"max|err| {row['worst']:<8.3g} {row['ms']:8.3f} ms {row['gbs']:6.0f} GB/s {row['copy']:5.0%} of copy "
            f"{row['torch_ms'] / row['ms']:6.1f}x torch  target {row['target']}"
            + (f"  {row['note'][:80]}" if row["note"] else ""))


def best_index(results: list[dict[str, Any]]) -> int | None:
    """The fastest channel-last row that passed its check, or None."""
    ok = [i for i, r in enumerate(results) if r["layout"] == "channel-last" and r["check"] == "PASS"]
    return min(ok, key=lambda i: results[i]["ms"]) if ok else None


def format_table(results: list[dict[str, Any]]) -> str:
    """One line per variant, the fastest correct channel-last tile marked *, then that tile as code."""
    best = best_index(results)
    lines = [_line(r, i == best) for i, r in enumerate(results)]
    if best is not None:
        tile = results[best]["tile"].removesuffix(" (default)")
        rows, rest = tile.split("x")
        channels, warps = rest.removesuffix("w").split("/")
        lines.append(f"best channel-last: ChannelLastTile(rows={rows}, channels={channels}, warps={warps})")
    return "\n".join(lines)


def records(results: list[dict[str, Any]]) -> list[Record]:
    """One record per variant (Triton, its tile in the shape label) and one per layout for the torch provider:
    ms per call, GB/s and the share of the copy bandwidth."""
    out, src = [], "benchmarks/gpu_sweep_conv.py"
    for layout in dict.fromkeys(r["layout"] for r in results):
        mine = [r for r in results if r["layout"] == layout]
        first = next((r for r in mine if math.isfinite(r["ms"])), mine[0])  # a variant that ran, when one did
        share = first["ms"] / first["torch_ms"]  # the torch provider's GB/s over Triton's, on the same bytes
        out.append(record("operator", src, "causal_conv1d", "torch", f"{layout} bf16", ms=first["torch_ms"],
                          rate=first["gbs"] * share, metric="GB/s", roofline=first["copy"] * share))
    for r in results:
        out.append(record("operator", src, "causal_conv1d", "triton", f"{r['layout']} bf16, tile {r['tile']}",
                          ms=r["ms"], rate=r["gbs"], metric="GB/s", roofline=r["copy"], note=r["note"][:300]))
    return out


def main() -> int:
    status = bench_main("gpu_sweep_conv", run, format_table, wall_time=True, records=records)
    return 0 if status in (0, 1) else status  # a MISS is a finding of the sweep, not an error


if __name__ == "__main__":
    sys.exit(main())

"""The decode step's ``causal_conv1d_update`` at the Mamba-2-130m shape, by the grid's minimum program count.

    python3 benchmarks/gpu_conv_update.py            # ~20 s on an H200; a markdown table for RESULTS.md
    python3 benchmarks/gpu_conv_update.py --smoke    # tiny sizes on the CPU (Triton interpreter): the script itself

Mamba-2-130m's decode conv: x a ``[B, 1792]`` bf16 column view of the in_proj output ``[B, 3352]`` (as
`infinilm.layers.ssm` passes it), state slots ``[B, 1792, 3]`` bf16, weight ``[1792, 4]`` and bias bf16, SiLU, one
slot per row. Each way: 20 back-to-back calls over distinct states and inputs in one CUDA graph, the median of 20
replays, per call (graph replay against graph replay); the Triton provider with
``infiniops_triton.causal_conv1d.UPDATE_PROGRAMS`` set to each value (0: the grid of 1024-channel programs it had
before), and the torch provider. Each Triton way's output and new state are checked against the torch provider's
on the same inputs (bf16 rule of the tolerance table).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from gpu_decode import graph_time

import infiniops_py as ops
from infiniops_py.testing.tolerances import Allclose, tolerance

PROGRAMS = (0, 32, 64, 128, 256)
BATCHES = (1, 8, 64)
COPIES = 20


def _case(batch: int, dim: int, width: int, device: torch.device, gen: torch.Generator) -> dict[str, torch.Tensor]:
    zx = torch.randn(batch, 3352 if dim == 1792 else 2 * dim, device=device, generator=gen).to(torch.bfloat16)
    lo = 1536 if dim == 1792 else dim // 2
    return {"x": zx[:, lo:lo + dim], "state": torch.randn(batch, dim, width - 1, device=device,
                                                         generator=gen).to(torch.bfloat16),
            "weight": (torch.randn(dim, width, device=device, generator=gen) / 2).to(torch.bfloat16),
            "bias": torch.randn(dim, device=device, generator=gen).to(torch.bfloat16),
            "rows": torch.arange(batch, device=device, dtype=torch.int32)}


def _call(provider: str, c: dict[str, torch.Tensor]) -> Callable[[], Any]:
    def run() -> torch.Tensor:
        with ops.use(provider, op="causal_conv1d_update"):
            return ops.causal_conv1d_update(c["x"], c["state"], c["weight"], c["bias"], activation="silu",
                                            conv_state_indices=c["rows"])
    return run


def _close(got: torch.Tensor, ref: torch.Tensor) -> bool:
    tol = tolerance("causal_conv1d_update", "bfloat16")
    assert isinstance(tol, Allclose)
    return bool(torch.allclose(got.float(), ref.float(), atol=tol.atol, rtol=tol.rtol))


def run(device: torch.device, smoke: bool) -> tuple[list[dict[str, Any]], bool]:
    from infiniops_triton import causal_conv1d as tconv

    dim, batches, copies = (40, (1, 3), 2) if smoke else (1792, BATCHES, COPIES)
    saved, rows, ok = tconv.UPDATE_PROGRAMS, [], True
    try:
        for batch in batches:
            gen = torch.Generator(device=device).manual_seed(batch)
            cases = [_case(batch, dim, 4, device, gen) for _ in range(copies)]
            first = {k: v.clone() for k, v in cases[0].items()}
            ref_state = first["state"].clone()
            ref_case = {**first, "state": ref_state}
            ref_out = _call("torch", ref_case)()
            row: dict[str, Any] = {"batch": batch}
            if not smoke:
                row["torch us"] = graph_time([_call("torch", c) for c in cases], device) * 1e6
            for programs in PROGRAMS:
                tconv.UPDATE_PROGRAMS = programs
                check = {**first, "state": first["state"].clone()}
                out = _call("triton", check)()
                good = _close(out, ref_out) and _close(check["state"], ref_state)
                ok &= good
                label = f"triton {programs or 'before'}"
                row[label + " us"] = (graph_time([_call("triton", c) for c in cases], device) * 1e6
                                      if not smoke else float("nan"))
                row[label + " check"] = "PASS" if good else "FAIL"
            rows.append(row)
    finally:
        tconv.UPDATE_PROGRAMS = saved
    return rows, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("gpu_conv_update.py needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    if args.smoke:
        import os

        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("INFINIOPS_TRITON_INTERPRET_CPU", "1")
        ops.reload()
    device = torch.device("cpu" if args.smoke else "cuda")
    rows, ok = run(device, args.smoke)
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(f"{r[k]:.2f}" if isinstance(r[k], float) else str(r[k]) for k in keys) + " |")
    print(f"outputs and states {'match the torch provider' if ok else 'DIFFER'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""The batch-1 decode kernels one at a time, for Nsight Compute (issue #23: what bounds a 5-12 us kernel).

    ncu --clock-control none --set full --profile-from-start off python3 benchmarks/ncu_decode.py [--smoke]

Runs each a few times (the first calls autotune and compile), then once more between ``cudaProfilerStart`` and
``Stop`` (what ncu profiles with ``--profile-from-start off``): the paged decode attention of the Qwen3-0.6B
shape at batch 1 and 32 (context 130, 16/8 heads, head dim 128, blocks of 16, the new token appended), the
Triton GEMV of its qkv and o projections at M 1, and the batched sampler at batch 1 over 151936 logits. No
timing: the profiler measures. ``--long``: only the paged decode attention of issue #26's bandwidth case
(batch 64, context 4096, 32/8 heads). ``--smoke``: tiny sizes on the CPU under the Triton interpreter.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from gpu_decode import _our_attention, _our_gemm, _paged_case

import infiniops_py as ops


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--long", action="store_true", help="only the batch-64, context-4096 decode attention")
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.smoke else "cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    ctx, vocab = (20, 300) if args.smoke else (130, 151936)
    calls: list[Callable[[], object]] = []
    if args.long:
        long_case = _paged_case(2 if args.smoke else 64, 40 if args.smoke else 4096, 4 if args.smoke else 32,
                                2 if args.smoke else 8, device, gen, d=64 if args.smoke else 128)
        return _profile([lambda: _our_attention(long_case)], device, args.repeats)
    for batch in (1, 32):
        case = _paged_case(batch, ctx, 16, 8, device, gen, d=64 if args.smoke else 128)
        calls.append(lambda case=case: _our_attention(case))
    for k, n in ((64, 48),) if args.smoke else ((1024, 4096), (2048, 1024)):
        w = torch.randn(n, k, generator=gen, device=device, dtype=torch.bfloat16)
        x = torch.randn(1, k, generator=gen, device=device, dtype=torch.bfloat16)
        out = torch.empty(1, n, device=device, dtype=torch.bfloat16)
        calls.append(lambda x=x, w=w, out=out: _our_gemm(x, w, out))
    logits = torch.randn(1, vocab, generator=gen, device=device, dtype=torch.bfloat16) * 4

    def sample() -> object:
        with ops.use("triton", op="top_k_top_p_sampling_from_logits"):
            return ops.top_k_top_p_sampling_from_logits(logits, 50, 0.9, temperature=0.8, seed=1)

    calls.append(sample)
    return _profile(calls, device, args.repeats)


def _profile(calls: list[Callable[[], object]], device: torch.device, repeats: int) -> int:
    """Each call `repeats` times (autotuning, compiles), then once each inside the profiler's range."""
    for call in calls:
        for _ in range(repeats):
            call()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
    for call in calls:
        call()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    print("done")
    return 0

if __name__ == "__main__":
    sys.exit(main())

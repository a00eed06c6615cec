"""Host microseconds per public call above the kernel launch, on the CPU (issue #25's host-cost rows).

The Triton provider serves CPU tensors under its interpreter switch (``TRITON_INTERPRET=1``,
``INFINIOPS_TRITON_INTERPRET_CPU=1``, set here before anything imports Triton), and the launch itself is
stubbed out (`_fastlaunch.Launcher.__call__` and `_launch.Tuned.launch` do nothing), so what is timed is
exactly our Python above the launch: the public function's checks and key, `dispatch`, and the provider's
host wrapper (its launch parameters, grid and scratch). The calls run inside ``use("triton")`` on bf16 CPU
tensors shaped like the H200 rows of ``benchmarks/gpu_host_cost.py`` (smaller: nothing is computed), and
index tensors are not range-checked (``unchecked_indices()``, as on CUDA by default).

Each figure is the best over `rounds` rounds of `calls` calls of this thread's CPU time
(``time.thread_time_ns``: other processes on a shared machine do not count), rounds interleaving the cases,
the garbage collector off.

    python benchmarks/host_overhead.py [--rounds 30] [--calls 300] [--only gemm_m1,add] [--profile gemm_m1]
    python benchmarks/host_overhead.py --smoke   # every case a few times (a test runs this)
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"
os.environ["INFINIOPS_TRITON_INTERPRET_CPU"] = "1"

import argparse
import cProfile
import gc
import platform
import pstats
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import triton

import infiniops_py as ops
from infiniops_py.operators._base import unchecked_indices

BF16 = torch.bfloat16


def stub_launches() -> None:
    """Make every Triton launch of the provider a no-op (the launch path is not what this script measures)."""
    from infiniops_triton import _fastlaunch, _launch

    _fastlaunch.Launcher.__call__ = lambda self, grid, *args, **kwargs: None  # type: ignore[method-assign]
    _launch.Tuned.launch = lambda self, key, grid, *args, **kwargs: None  # type: ignore[method-assign]


def cases() -> dict[str, Callable[[], Any]]:
    """The public calls, by name: a zero-argument function each."""
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(BF16)

    k, n = 1024, 4096
    w = r(n, k)
    a1, a32 = r(1, k), r(32, k)
    x, res, nw = r(32, k), r(32, k), r(k)
    y = r(32, k)
    su = r(32, 2 * k)
    t, hkv, d, bs = 16, 8, 128, 16
    key, value = r(t, hkv, d), r(t, hkv, d)
    kc, vc = torch.zeros(8, bs, hkv, d, dtype=BF16), torch.zeros(8, bs, hkv, d, dtype=BF16)
    slots = torch.randperm(8 * bs, generator=g)[:t]
    xs, ws = r(1, k), r(2 * 3072, k)
    return {
        "gemm_m1": lambda: ops.gemm(a1, w, trans_b=True),
        "gemm_m32": lambda: ops.gemm(a32, w, trans_b=True),
        "rms_norm": lambda: ops.rms_norm(x, nw, 1e-6),
        "fused_add_rms_norm": lambda: ops.fused_add_rms_norm(x, res, nw, 1e-6),
        "silu_and_mul": lambda: ops.silu_and_mul(su),
        "add": lambda: ops.add(x, y),
        "reshape_and_cache_flash": lambda: ops.reshape_and_cache_flash(key, value, kc, vc, slots),
        "gemm_swiglu": lambda: ops.gemm_swiglu(xs, ws),
    }


def measure(fns: dict[str, Callable[[], Any]], calls: int, rounds: int) -> dict[str, float]:
    """Best over `rounds` interleaved rounds of this thread's CPU microseconds per call, by name."""
    best = dict.fromkeys(fns, float("inf"))
    for fn in fns.values():  # warm up: resolution, the autotuner's choice, caches
        for _ in range(3):
            fn()
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            for name, fn in fns.items():
                start = time.thread_time_ns()
                for _ in range(calls):
                    fn()
                best[name] = min(best[name], (time.thread_time_ns() - start) / calls / 1e3)
    finally:
        gc.enable()
    return best


def header() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {load[0]:.2f}; "
            f"python {platform.python_version()}, torch {torch.__version__}, triton {triton.__version__}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds, the best is kept (default 30)")
    parser.add_argument("--calls", type=int, default=300, help="calls per round (default 300)")
    parser.add_argument("--only", help="comma-separated case names (default: all)")
    parser.add_argument("--profile", help="print a cProfile of this case instead of timing")
    parser.add_argument("--smoke", action="store_true", help="every case a few times (a quick dry run)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    stub_launches()
    fns = cases()
    if args.only:
        names = [s.strip() for s in args.only.split(",") if s.strip()]
        unknown = [s for s in names if s not in fns]
        if unknown or not names:
            parser.error(f"--only: unknown case(s) {unknown}; known: {', '.join(fns)}")
        fns = {s: fns[s] for s in names}
    rounds, calls = (2, 5) if args.smoke else (args.rounds, args.calls)
    if rounds < 1 or calls < 1:
        parser.error("--rounds and --calls must be >= 1")
    with ops.use("triton"), unchecked_indices():
        if args.profile:
            fn = fns[args.profile]
            for _ in range(3):
                fn()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(calls * rounds):
                fn()
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            return 0
        best = measure(fns, calls, rounds)
    print(header())
    print("| case | us per call (thread CPU, best of rounds) |")
    print("|---|---|")
    for name, us in best.items():
        print(f"| {name} | {us:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

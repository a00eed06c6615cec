"""Host microseconds per public call above the kernel launch, on the CPU (issue #25's host-cost rows).

The Triton provider serves CPU tensors under its interpreter switch (``TRITON_INTERPRET=1``,
``INFINIOPS_TRITON_INTERPRET_CPU=1``, set here before anything imports Triton), and the launch itself is
stubbed out (`_fastlaunch.Launcher.__call__` and `_launch.Tuned.launch` do nothing), so what is timed is
exactly our Python above the launch: the public function's checks and key, `dispatch`, and the provider's
host wrapper (its launch parameters, grid and scratch). The calls run inside ``use("triton")`` on bf16 CPU
tensors shaped like the H200 rows of ``benchmarks/gpu_host_cost.py`` (smaller: nothing is computed), and
index tensors are not range-checked (``unchecked_indices()``, as on CUDA by default).

With ``--launch`` the launch layer is timed too: the kernels stay Triton JIT functions (no interpreter), the
provider accepts CPU tensors, and every launch runs `_fastlaunch.Launcher`'s and `_launch.Tuned`'s whole path
down to the C launch, which does nothing (a fake compiled kernel; the first call of a key "compiles" it, an
autotuner picks its first configuration; `JITFunction.run`, reached by a plain ``kernel[grid](...)``, does
nothing). The difference between the two modes is the launch layer's Python (and the provider's branches
that differ off the interpreter: launch settings from its tables, not the interpreter's small ones); the C
launcher's own argument parsing and ``cuLaunchKernel`` are in neither.

Each figure is the best over `rounds` rounds of `calls` calls of this thread's CPU time
(``time.thread_time_ns``: other processes on a shared machine do not count), rounds interleaving the cases,
the garbage collector off.

    python benchmarks/host_overhead.py [--rounds 30] [--calls 300] [--only gemm_m1,add] [--profile selective_scan]
    python benchmarks/host_overhead.py --launch [...]   # the fast launcher's path included (see above)
    python benchmarks/host_overhead.py --smoke [--launch]   # every case a few times (a test runs this)
"""

from __future__ import annotations

import os
import sys

# read before Triton is imported: the interpreter switch decides what kind of function `triton.jit` makes
os.environ["TRITON_INTERPRET"] = "0" if "--launch" in sys.argv[1:] else "1"
os.environ["INFINIOPS_TRITON_INTERPRET_CPU"] = "1"

import argparse
import cProfile
import gc
import platform
import pstats
import time
from collections.abc import Callable
from typing import Any

import torch
import triton

import infiniops_py as ops
from infiniops_py.operators._base import unchecked_indices

BF16 = torch.bfloat16
LAUNCH = os.environ["TRITON_INTERPRET"] == "0"  # --launch


def stub_launches() -> None:
    """Make every Triton launch of the provider a no-op (the launch path is not what this script measures):
    `Launcher` and `Tuned` calls, and under them the interpreter's own launch (``InterpretedFunction.run``),
    which a ``kernel[grid](...)`` outside them reaches (the SSD chunk kernels, the varlen prefill's chosen
    configuration); there Triton's heuristics and autotuner wrappers still run, as on the GPU."""
    from infiniops_triton import _fastlaunch, _launch
    from triton.runtime.interpreter import InterpretedFunction

    _fastlaunch.Launcher.__call__ = lambda self, grid, *args, **kwargs: None  # type: ignore[method-assign]
    _launch.Tuned.launch = lambda self, key, grid, *args, **kwargs: None  # type: ignore[method-assign]
    InterpretedFunction.run = lambda self, *args, grid, warmup, **kwargs: None  # type: ignore[method-assign]


def fake_device() -> None:
    """``--launch``: the provider serves CPU tensors with its JIT kernels, and every launch runs the fast path's
    Python down to a C launch that does nothing (the module docstring). Call before the provider loads."""
    from infiniops_triton import _common, _fastlaunch
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    _common.interpreting_on_cpu = lambda: True  # type: ignore[assignment]  # the capabilities declare cpu
    torch._C._cuda_getDevice = lambda: 0  # type: ignore[attr-defined]
    torch._C._cuda_getCurrentRawStream = lambda device: 0  # type: ignore[attr-defined]
    _fastlaunch.set_enabled(True)

    class Run:
        """A CudaLauncher's attributes, its C launch a no-op."""

        global_scratch_size = profile_scratch_size = 0
        launch_cooperative_grid = launch_pdl = False

        @staticmethod
        def launch(*args: Any) -> None:
            return None

    class Compiled:
        """What `_fastlaunch._Bound` reads of a compiled kernel."""

        function, packed_metadata, run = 1, (), Run()

        def launch_metadata(self, *args: Any) -> None:
            return None

    def compile_fake(self: JITFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        return Compiled()

    def choose_first(self: Autotuner, *args: Any, **kwargs: Any) -> None:
        self.best_config = self.configs[0]

    from triton.backends.nvidia import driver

    driver.CudaLauncher = Run  # type: ignore[misc,assignment]  # `_Bound` checks the launcher's class
    JITFunction.run = compile_fake  # type: ignore[method-assign]  # a miss, or a plain kernel[grid](...)
    Autotuner.run = choose_first  # type: ignore[method-assign]


def cases() -> dict[str, Callable[[], Any]]:
    """The public calls, by name: a zero-argument function each."""
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(BF16)

    return {**_dense(r, g), **_attention(r, g), **_ssm(r, g), **_rope(r, g)}


def _dense(r: Callable[..., torch.Tensor], g: torch.Generator) -> dict[str, Callable[[], Any]]:
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
    xd, wd, rd = r(1, 3072), r(k, 3072), r(1, k)  # a Qwen3-0.6B down projection into the residual stream
    return {
        "gemm_m1": lambda: ops.gemm(a1, w, trans_b=True),
        "gemm_m32": lambda: ops.gemm(a32, w, trans_b=True),
        "rms_norm": lambda: ops.rms_norm(x, nw, 1e-6),
        "fused_add_rms_norm": lambda: ops.fused_add_rms_norm(x, res, nw, 1e-6),
        "silu_and_mul": lambda: ops.silu_and_mul(su),
        "add": lambda: ops.add(x, y),
        "reshape_and_cache_flash": lambda: ops.reshape_and_cache_flash(key, value, kc, vc, slots),
        "gemm_swiglu": lambda: ops.gemm_swiglu(xs, ws),
        "gemm_add_rms_norm": lambda: ops.gemm_add_rms_norm(xd, wd, rd, nw, 1e-6),
        "rms_norm_gemm": lambda: ops.rms_norm_gemm(a1, nw, w),  # a Qwen3-0.6B qkv projection after its norm
    }


def _attention(r: Callable[..., torch.Tensor], g: torch.Generator) -> dict[str, Callable[[], Any]]:
    b, s, h, d = 4, 32, 4, 64  # varlen prefill: 4 sequences of 32
    q, k, v = r(b * s, h, d), r(b * s, h, d), r(b * s, h, d)
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32)
    batch, ctx, hq, hkv, bs = 8, 64, 8, 2, 16  # paged decode
    per = ctx // bs
    kc, vc = r(batch * per, bs, hkv, d), r(batch * per, bs, hkv, d)
    table = torch.randperm(batch * per, generator=g).to(torch.int32).view(batch, per)
    lens = torch.full((batch,), ctx, dtype=torch.int32)
    qd = r(batch, 1, hq, d)
    return {
        "flash_attn_varlen": lambda: ops.flash_attn_varlen(q, k, v, cu, cu, s, s, causal=True),
        "flash_attn_with_kvcache": lambda: ops.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=lens,
                                                                       block_table=table),
    }


def _ssm(r: Callable[..., torch.Tensor], g: torch.Generator) -> dict[str, Callable[[], Any]]:
    f32 = torch.float32
    bt, ln, h, p, n, chunk = 2, 64, 4, 16, 16, 32  # Mamba-2's scan, small
    x, dt = r(bt, ln, h, p), r(bt, ln, h)
    a = -torch.rand(h, generator=g) - 0.5
    b, c = r(bt, ln, 1, n), r(bt, ln, 1, n)
    dd, dt_bias = r(h).to(f32), r(h).to(f32)
    batch, slots = 8, 16  # its decode step: the state of 8 of 16 slots
    state = r(slots, h, p, n).to(f32)
    xu, dtu, bu, cu = r(batch, h, p), r(batch, h), r(batch, 1, n), r(batch, 1, n)
    idx = torch.randperm(slots, generator=g)[:batch].to(torch.int32)
    cb, dim, cl, width = 2, 64, 40, 4  # the short convolution before it
    cx, cw, cbias = r(cb, dim, cl), r(dim, width), r(dim)
    ux, ustate = r(batch, dim), r(slots, dim, width - 1)
    hg, groups = 64, 2  # the gated norm after it
    gx, gz, gw = r(batch, hg), r(batch, hg), r(hg)
    return {
        "selective_scan": lambda: ops.selective_scan(x, dt, a, b, c, D=dd, dt_bias=dt_bias, dt_softplus=True,
                                                     chunk_size=chunk),
        "selective_state_update": lambda: ops.selective_state_update(state, xu, dtu, a, bu, cu, D=dd,
                                                                     dt_bias=dt_bias, dt_softplus=True,
                                                                     state_batch_indices=idx),
        "causal_conv1d": lambda: ops.causal_conv1d(cx, cw, cbias, activation="silu"),
        "causal_conv1d_update": lambda: ops.causal_conv1d_update(ux, ustate, cw, cbias, activation="silu",
                                                                 conv_state_indices=idx),
        "rms_norm_gated": lambda: ops.rms_norm_gated(gx, gw, None, z=gz, eps=1e-5, group_size=hg // groups,
                                                     norm_before_gate=False),
    }


def _rope(r: Callable[..., torch.Tensor], g: torch.Generator) -> dict[str, Callable[[], Any]]:
    t, hq, hkv, d = 16, 8, 2, 64  # a decode batch of 16 tokens
    positions = torch.randint(0, 256, (t,), generator=g)
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = torch.arange(256, dtype=torch.float32)[:, None] * inv
    cache = torch.cat((angles.cos(), angles.sin()), dim=-1).to(BF16)
    qkv = r(t, (hq + 2 * hkv) * d)
    q, k = qkv[:, : hq * d], qkv[:, hq * d : (hq + hkv) * d]
    qw, kw = r(d), r(d)
    return {
        "rotary_embedding": lambda: ops.rotary_embedding(positions, q, k, d, cache, True),
        "fused_qk_norm": lambda: ops.fused_qk_norm(qkv, qw, kw, num_q_heads=hq, num_kv_heads=hkv, head_dim=d),
        "fused_qk_norm_rope": lambda: ops.fused_qk_norm_rope(qkv, qw, kw, cache, positions, num_q_heads=hq,
                                                             num_kv_heads=hkv, head_dim=d),
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
    parser.add_argument("--launch", action="store_true", help="time the fast launch path too (a fake C launch)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    fake_device() if LAUNCH else stub_launches()
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

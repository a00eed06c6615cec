"""Launch-configuration sweep of the Triton selective scan's kernels (Mamba-2 SSD) on the H200.

    python benchmarks/gpu_sweep_scan.py                 # < 2 min on the H200, compiles included
    python benchmarks/gpu_sweep_scan.py chunk_scan      # only that kernel's variants (then the best combined)

At the Mamba-2-130m layer shape (H=24, P=64, N=128, G=1, chunk 256; bf16 x/B/C/z, fp32 dt/A/D; D, dt_bias,
softplus and final states), 8 x 2048 and 1 x 2048 tokens. Each variant fixes the launch configuration of
one kernel (the others keep their defaults, the autotuner's pick) and is

- checked end to end against the float64 reference (on the same GPU) with the bf16 tolerance: PASS/FAIL;
- timed (``triton.testing.do_bench`` median, short warm-up): its kernel alone and the whole prefill (every
  launch in order on one workspace, so without the allocation and host checks of a public call).

The kernels run one after another, so the best variant of each is the fastest passing one of its kernel
at 8 x 2048; the last variant combines them. The torch provider's prefill is timed in the same run and the
ratio to it is printed (the target: >= 30x at 8 x 2048). The table comes last, the best of each kernel marked
``*``: its configuration becomes the kernel's default (CONFIGS and FACTORED in _ssd_chunk_scan.py, CONFIGS in
_ssd_chunk_state.py, the block and step in _ssd_state_passing.py, PRESPLIT in selective_scan.py; all under
providers/triton/infiniops_triton/).

`run(results)` appends one dict per table line, like the family scripts (benchmarks/ops.py).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import infiniops_py
from infiniops_py.operators.selective_scan import selective_scan
from infiniops_py.testing.compare import compare
from infiniops_py.testing.tolerances import tolerance

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)  # benchmarks/_common.py and gpu_ssm.py, also when a test loads this file by path
from _common import Timer
from gpu_ssm import MAMBA2_130M, Layer, scan_call, scan_case

FAMILY = "ssm-sweep"
SIZES = ((8, 2048), (1, 2048))  # (rows, tokens); the first one ranks the variants
VS_TORCH_TARGET = 30.0
STAGES = ("chunk_state", "chunk_cb", "state_passing", "chunk_scan")  # the launches; "layout" spans them
BUDGET_S = 95.0  # variants left when this much wall time has passed are skipped (said so), then the best runs
Config = dict[str, int]
SMALL = Layer(heads=2, head_dim=16, d_state=16, groups=1, chunk=32)  # a CPU run: two 16-token blocks a chunk

# (kernel, label, configuration). chunk_scan: BLOCK_NS slices N in the C . S product, "fact" takes separable
# decays in the full blocks (FACTORED); chunk_state: "wx" weights x, "wB" weights B (WEIGHT_X); "r128" caps
# the registers at 128 a thread (maxnreg: more programs per SM). "old" is the previous default. "layout"
# PRESPLIT 0: the states stay fp32 for the chunk scan (split there, per program), as before.


def _label(cfg: Config) -> str:
    names = {"BLOCK_M": "M", "BLOCK_K": "K", "BLOCK_P": "P", "BLOCK_N": "N", "BLOCK_NS": "NS", "BLOCK": "BLOCK",
             "CHUNKS_PER_STEP": "step", "num_warps": "w", "num_stages": "s", "maxnreg": "r"}
    parts = [f"{names[k]}{v}" for k, v in cfg.items() if k in names]
    if "FACTORED" in cfg:
        parts.append("fact" if cfg["FACTORED"] else "direct")
    if "WEIGHT_X" in cfg:
        parts.append("wx" if cfg["WEIGHT_X"] else "wB")
    if "PRESPLIT" in cfg:
        parts.append(f"PRESPLIT {'on' if cfg['PRESPLIT'] else 'off'}")
    return " ".join(parts)


def _scan(m: int, k: int, p: int, ns: int, fact: int, w: int, s: int, reg: int = 0) -> Config:
    cfg = dict(BLOCK_M=m, BLOCK_K=k, BLOCK_P=p, BLOCK_NS=ns, FACTORED=fact, num_warps=w, num_stages=s)
    return {**cfg, "maxnreg": reg} if reg else cfg


def _state(p: int, n: int, k: int, wx: int, w: int, s: int, reg: int = 0) -> Config:
    cfg = dict(BLOCK_P=p, BLOCK_N=n, BLOCK_K=k, WEIGHT_X=wx, num_warps=w, num_stages=s)
    return {**cfg, "maxnreg": reg} if reg else cfg


_OLD = {  # the launch configurations before this sweep
    "chunk_scan": _scan(64, 64, 64, 128, 0, 4, 2),
    "chunk_state": _state(64, 128, 64, 0, 8, 2),
    "state_passing": dict(BLOCK=256, CHUNKS_PER_STEP=8, num_warps=4),
}
_VARIANT_CONFIGS: list[tuple[str, Config]] = [
    ("layout", {"PRESPLIT": 0}),  # step 3 splits the fp32 states itself (as before), default kernel configs
    ("chunk_scan", _OLD["chunk_scan"]),
    *[("chunk_scan", _scan(*c)) for c in (
        (64, 32, 64, 32, 0, 4, 3, 128), (64, 32, 64, 32, 1, 4, 3, 128), (64, 32, 64, 32, 0, 4, 2, 128),
        (64, 32, 64, 32, 0, 4, 3), (64, 32, 64, 32, 1, 4, 3), (128, 32, 64, 32, 0, 8, 3),
        (128, 32, 64, 32, 0, 8, 3, 128), (128, 32, 64, 32, 1, 8, 3, 128), (64, 64, 64, 64, 0, 4, 2),
        (64, 64, 64, 64, 1, 4, 2), (64, 32, 32, 32, 0, 4, 3), (64, 32, 32, 32, 1, 4, 3),
        (64, 32, 64, 32, 1, 4, 4, 128),
    )],
    ("state_passing", _OLD["state_passing"]),
    *[("state_passing", dict(BLOCK=b, CHUNKS_PER_STEP=c, num_warps=w))
      for b, c, w in ((128, 8, 4), (512, 8, 4), (256, 4, 4), (256, 16, 8), (512, 4, 8), (1024, 8, 8))],
    ("chunk_state", _OLD["chunk_state"]),
    *[("chunk_state", _state(*c)) for c in (
        (64, 128, 64, 1, 8, 2), (64, 64, 64, 1, 4, 2, 128), (64, 64, 64, 0, 4, 2), (64, 64, 32, 1, 4, 3),
        (64, 64, 32, 0, 4, 3), (64, 128, 32, 0, 8, 3), (32, 64, 64, 0, 4, 2, 128),
    )],
]
VARIANTS: list[tuple[str, str, Config]] = [
    (kernel, ("old " if cfg in _OLD.values() else "") + _label(cfg), cfg) for kernel, cfg in _VARIANT_CONFIGS
]  # chunk_scan first (the largest share), then the cheap state_passing compiles, then chunk_state


def quick_ms(fn: Callable[[], Any]) -> float:
    """``triton.testing.do_bench``'s median in milliseconds, with a short warm-up and run (many variants)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def shrink(config: Config) -> Config:
    """`config` with every block at most 16 wide (64 states a step): a CPU run under the interpreter."""
    caps = {"BLOCK_M": 16, "BLOCK_K": 16, "BLOCK_P": 16, "BLOCK_NS": 16, "BLOCK_N": 16, "BLOCK": 64}
    return {k: min(v, caps[k]) if k in caps else v for k, v in config.items()}


def convention(args: tuple[torch.Tensor, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The implementation calling convention's arguments with fresh `out` and final-state buffers."""
    x, B = args[0], args[3]
    out = torch.empty_like(x)
    final = torch.empty(x.shape[0], x.shape[2], x.shape[3], B.shape[-1], device=x.device, dtype=torch.float32)
    return (*args, kwargs.get("D"), kwargs.get("z"), kwargs.get("dt_bias"), kwargs["dt_softplus"],
            kwargs["dt_limit"], kwargs.get("initial_states"), kwargs.get("seq_idx"), kwargs["chunk_size"], out, final)


def reference(args: tuple[torch.Tensor, ...], kwargs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 reference's output and final states."""
    def f64(v: Any) -> Any:
        return v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v

    with infiniops_py.use("reference"):
        out, final = selective_scan(*map(f64, args), **{k: f64(v) for k, v in kwargs.items()})
    return out, final


def check(conv: tuple[Any, ...], ref: tuple[torch.Tensor, torch.Tensor]) -> tuple[bool, float, str]:
    """The output and final states a variant left in `conv` against the reference, bf16 tolerance."""
    worst, message = 0.0, ""
    for label, got, want in (("out", conv[-2], ref[0]), ("final_states", conv[-1], ref[1])):
        err, failure = compare(label, got, want, tolerance("selective_scan", "bfloat16"))
        worst = max(worst, err)
        message = message or (failure or "")
    return not message, worst, message


def measure(args: tuple[torch.Tensor, ...], kwargs: dict[str, Any], ref: tuple[torch.Tensor, torch.Tensor],
            configs: dict[str, Config], kernel: str | None, timer: Timer) -> dict[str, Any]:
    """One variant at one size: PASS/FAIL, the time of `kernel`'s launch (every launch when None) and of the
    whole prefill."""
    from infiniops_triton.selective_scan import scan_stages

    conv = convention(args, kwargs)
    stages = scan_stages(*conv, configs=configs)

    def prefill() -> None:
        for _, launch in stages:
            launch()

    prefill()  # compiles (and autotunes the default kernels) once
    ok, worst, message = check(conv, ref)
    times = {name: timer(launch) for name, launch in stages if kernel in (None, name)}
    return {"ok": ok, "worst": worst, "note": message[:200], "stages": times, "total": timer(prefill)}


def _row(kernel: str, label: str, configs: dict[str, Config], per_size: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": "sweep", "family": FAMILY, "kernel": kernel, "case": label, "configs": configs,
            "status": "PASS" if all(m["ok"] for m in per_size) else "FAIL", "sizes": per_size, "best": False}


def _crashed(kernel: str, label: str, configs: dict[str, Config], e: Exception) -> dict[str, Any]:
    note = f"crashed: {type(e).__name__}: {e}"[:200]
    return _row(kernel, label, configs, [{"ok": False, "worst": math.inf, "note": note, "stages": {},
                                          "total": math.nan}])


def run_variant(kernel: str, label: str, configs: dict[str, Config], cases: list[tuple[Any, ...]],
                timer: Timer) -> dict[str, Any]:
    """A table row for one variant at every size (a crash is a FAIL row, the sweep goes on)."""
    try:
        per_size = [measure(args, kwargs, ref, configs, kernel if kernel in STAGES else None, timer)
                    for args, kwargs, ref in cases]
    except Exception as e:  # a configuration that does not compile or launch is a FAIL of its variant
        return _crashed(kernel, label, configs, e)
    return _row(kernel, label, configs, per_size)


def _first_ms(row: dict[str, Any], key: str | None) -> float:
    size = row["sizes"][0]
    value = size["total"] if key is None else size["stages"].get(key, math.nan)
    return value if row["status"] == "PASS" and math.isfinite(value) else math.inf


def mark_best(rows: list[dict[str, Any]]) -> dict[str, Config]:
    """Mark the fastest passing variant of each kernel (its launch alone at the first size) and the faster of
    the "layout" variants and the defaults (the whole prefill); their configurations."""
    best: dict[str, Config] = {}
    for kernel in dict.fromkeys(r["kernel"] for r in rows if r["kernel"] not in ("default", "best")):
        mine = [r for r in rows if r["kernel"] == kernel or (kernel == "layout" and r["kernel"] == "default")]
        key = kernel if kernel in STAGES else None
        winner = min(mine, key=lambda r: _first_ms(r, key))
        if math.isfinite(_first_ms(winner, key)) and kernel in winner["configs"]:
            winner["best"] = True
            best[kernel] = winner["configs"][kernel]
    return best


def _fmt(ms: float) -> str:
    return f"{ms:7.3f}" if math.isfinite(ms) else "      -"


def format_table(rows: list[dict[str, Any]], torch_ms: list[float] | None = None) -> str:
    """One line per variant: kernel, label, status, then per size the kernel's ms and the prefill's ms (and
    the ratio to the torch provider when its times are given); the best of each kernel marked ``*``."""
    sizes = " | ".join(f"{b}x{n}: kernel  prefill" + ("  xtorch" if torch_ms else "") for b, n in SIZES)
    lines = [f"{'kernel':<14} {'variant':<36} {'status':<6} | {sizes}"]
    for r in rows:
        cells = []
        for i, size in enumerate(r["sizes"]):
            key = r["kernel"] if r["kernel"] in size["stages"] else None
            stage = size["stages"][key] if key else sum(size["stages"].values())
            cell = f"{_fmt(stage)} {_fmt(size['total'])}"
            if torch_ms and i < len(torch_ms):
                cell += f" {torch_ms[i] / size['total']:7.1f}x" if size["total"] > 0 else "        -"
            cells.append(cell)
        mark = "*" if r["best"] else " "
        note = f"  {r['sizes'][0]['note'][:80]}" if r["status"] != "PASS" else ""
        lines.append(f"{r['kernel']:<14}{mark}{r['case'][:36]:<36} {r['status']:<6} | {' | '.join(cells)}{note}")
    return "\n".join(lines)


def run(results: list[dict[str, Any]], device: str = "cuda", *, small: bool = False, timer: Timer = quick_ms,
        variants: list[tuple[str, str, Config]] | None = None, budget_s: float = BUDGET_S) -> list[float]:
    """Sweep `variants` (default `VARIANTS`) at `SIZES`; append one row per variant (then the defaults and
    the best combination) to `results`, printing each as it comes; return the torch provider's ms per size.
    Variants still to run after `budget_s` seconds are skipped, with a line saying how many.

    `small`: `SMALL` at 2 rows of 40 tokens at most, blocks shrunk (a CPU run under the Triton interpreter).
    """
    start = time.perf_counter()
    layer = SMALL if small else MAMBA2_130M
    cases, torch_ms = [], []
    for batch, length in SIZES:
        batch, length = (min(batch, 2), length // 50) if small else (batch, length)
        args, kwargs = scan_case(batch, length, layer, torch.bfloat16, device, seed=11)
        cases.append((args, kwargs, reference(args, kwargs)))
        torch_ms.append(timer(scan_call("torch", args, kwargs)))
        print(f"torch provider {batch}x{length}: {torch_ms[-1]:.3f} ms", flush=True)
    todo = [("default", "autotuned defaults", {}),
            *[(k, label, {k: shrink(c) if small else c}) for k, label, c in (variants or VARIANTS)]]
    rows: list[dict[str, Any]] = []
    for i, (kernel, label, configs) in enumerate(todo):
        if time.perf_counter() - start > budget_s:
            print(f"time budget of {budget_s:.0f} s spent: {len(todo) - i} variants skipped", flush=True)
            break
        rows.append(run_variant(kernel, label, configs, cases, timer))
        print(format_table(rows[-1:], torch_ms).splitlines()[-1], flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    best = mark_best(rows)
    rows.append(run_variant("best", "best of each kernel", best, cases, timer))
    results.extend(rows)
    return torch_ms


def main(argv: list[str]) -> int:
    """Run the sweep (the variants of the kernels named in `argv`, or all) and print the table; 0 when every
    variant passed, 1 otherwise, 2 without CUDA or for an unknown kernel name."""
    if not torch.cuda.is_available():
        print("gpu_sweep_scan: needs a CUDA device", file=sys.stderr)
        return 2
    kernels = {k for k, _, _ in VARIANTS}
    if unknown := set(argv) - kernels:
        print(f"gpu_sweep_scan: unknown kernel {sorted(unknown)}; choose from {sorted(kernels)}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    torch_ms = run(rows, variants=[v for v in VARIANTS if not argv or v[0] in argv])
    print(f"\nbest configurations: {rows[-1]['configs']}")
    best_total = rows[-1]["sizes"][0]["total"]
    ratio = torch_ms[0] / best_total if best_total > 0 else math.nan
    verdict = "PASS" if ratio >= VS_TORCH_TARGET else "MISS"
    print(f"8x2048 best prefill {best_total:.3f} ms (launches only; benchmarks/gpu_ssm.py times the public call), "
          f"torch {torch_ms[0]:.3f} ms: {ratio:.1f}x torch, target >= {VS_TORCH_TARGET:.0f}x: {verdict}")
    print(f"gpu_sweep_scan: {time.perf_counter() - start:.0f} s in all\n")
    print(format_table(rows, torch_ms))
    return 0 if all(r["status"] == "PASS" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

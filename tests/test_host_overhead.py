"""benchmarks/host_overhead.py's dry run: every case runs through the Triton provider's host path on CPU.

The script sets the interpreter switches before it imports Triton, so it runs in its own process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = ("gemm_m1", "gemm_m32", "rms_norm", "fused_add_rms_norm", "silu_and_mul", "add", "reshape_and_cache_flash",
         "gemm_swiglu", "gemm_add_rms_norm", "rms_norm_gemm", "flash_attn_varlen", "flash_attn_with_kvcache",
         "selective_scan", "selective_state_update", "causal_conv1d", "causal_conv1d_update", "rms_norm_gated",
         "rotary_embedding", "fused_qk_norm", "fused_qk_norm_rope")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    paths = [str(ROOT / p) for p in (".", "providers/torch", "providers/triton", "providers/cupy")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "host_overhead.py"), "--smoke", *args],
                          env=env, capture_output=True, text=True, timeout=600, check=False)


def test_host_overhead_smoke_times_every_case() -> None:
    done = _run()
    assert done.returncode == 0, done.stderr[-4000:]
    rows = dict(re.findall(r"^\| (\w+) \| ([0-9.]+) \|$", done.stdout, re.MULTILINE))
    assert sorted(rows) == sorted(CASES), done.stdout
    assert all(float(us) > 0 for us in rows.values()), rows


def test_host_overhead_smoke_with_the_launch_layer_times_every_case() -> None:
    done = _run("--launch")  # JIT kernels, the fast launcher's path down to a fake C launch
    assert done.returncode == 0, done.stderr[-4000:]
    rows = dict(re.findall(r"^\| (\w+) \| ([0-9.]+) \|$", done.stdout, re.MULTILINE))
    assert sorted(rows) == sorted(CASES), done.stdout
    assert all(float(us) > 0 for us in rows.values()), rows


def test_host_overhead_rejects_an_unknown_case() -> None:
    done = _run("--only", "gemm_m1,nope")
    assert done.returncode == 2 and "nope" in done.stderr

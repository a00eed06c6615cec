"""The Triton provider on the CPU: runs each test module of tests/triton_interp in a subprocess under the
Triton interpreter.

The interpreter switch (``TRITON_INTERPRET=1``, ``INFINIOPS_TRITON_INTERPRET_CPU=1``) must be set before
Triton defines any kernel, so these tests cannot share this process; see tests/triton_interp/conftest.py.
One subprocess per module, so a failure names the kernel family it belongs to.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

FOLDER = Path(__file__).parent / "triton_interp"


@pytest.mark.parametrize("module", sorted(p.name for p in FOLDER.glob("test_*.py")))
def test_triton_kernels_under_the_interpreter(module: str) -> None:
    # a clean resolver: no provider allow-list, priorities, denials or strict mode leak in from the caller
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFINIOPS_")}
    env.update(TRITON_INTERPRET="1", INFINIOPS_TRITON_INTERPRET_CPU="1")
    cmd = [sys.executable, "-m", "pytest", str(FOLDER / module), "-q", "-p", "no:cacheprovider",
           "--rootdir", str(FOLDER.parent.parent)]
    # a hang guard only: test_triton_ssm.py takes about 90 s on a 2-core machine that runs the suite, and 300 s
    # squeezed onto one core shared with two busy processes (600 s was two such runs from failing the test)
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, f"{' '.join(cmd)} failed:\n{run.stdout[-20000:]}\n{run.stderr[-5000:]}"


def test_cli_check_runs_under_the_interpreter_outside_pytest() -> None:
    # the provider hook applies the interpreter fixes itself: a bfloat16 gemm (tl.dot) passes from the CLI
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFINIOPS_")}
    env.update(TRITON_INTERPRET="1", INFINIOPS_TRITON_INTERPRET_CPU="1")
    cmd = [sys.executable, "-m", "infiniops_py.cli", "check", "triton", "--device", "cpu", "--op", "gemm", "--dtype",
           "bfloat16", "--max-examples", "5", "--seed", "3"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"{' '.join(cmd)} failed:\n{run.stdout[-5000:]}\n{run.stderr[-5000:]}"

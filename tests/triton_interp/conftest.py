"""Run the Triton provider's kernels on the CPU through the Triton interpreter.

Every test module in this folder runs in a process of its own kind: ``TRITON_INTERPRET=1`` and
``INFINIOPS_TRITON_INTERPRET_CPU=1`` must be set before any Triton kernel is defined, so that the kernels
are interpreted and the Triton provider declares the ``cpu`` device too. ``tests/test_triton_interp.py``
runs this folder in a subprocess with both set (and ``tests/conftest.py`` keeps it out of the normal
collection); this conftest sets them again, for a direct ``pytest tests/triton_interp`` run with the
variables exported, and refuses to run when a kernel module was imported before it.

It also applies the provider's fixes to the Triton 3.6 interpreter (`infiniops_triton._interpreter`), which
the provider hook applies too under the switch, so that the CPU runs compute what the GPU computes.
"""

from __future__ import annotations

import os
import sys

import pytest

os.environ["TRITON_INTERPRET"] = "1"
os.environ["INFINIOPS_TRITON_INTERPRET_CPU"] = "1"

_early = sorted(m for m in sys.modules if m.startswith("infiniops_triton."))
if _early:
    raise pytest.UsageError(
        f"Triton kernel modules {_early} were imported before tests/triton_interp/conftest.py set "
        "TRITON_INTERPRET=1; run `pytest tests/test_triton_interp.py`, or export TRITON_INTERPRET=1 and "
        "INFINIOPS_TRITON_INTERPRET_CPU=1 before `pytest tests/triton_interp`"
    )

from infiniops_triton._interpreter import patch_interpreter  # noqa: E402

import infiniops_py  # noqa: E402

patch_interpreter()
infiniops_py.reload()

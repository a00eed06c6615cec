"""What the Triton provider's implementations share: devices, priority and the interpreter switch.

Users see a ``cuda``-only provider. For CI, the Triton interpreter runs kernels on CPU tensors: with both
``TRITON_INTERPRET=1`` and ``INFINIOPS_TRITON_INTERPRET_CPU=1`` set when the provider loads, ``cpu`` is
declared too (the conformance test sets both, for its own process only).
"""

from __future__ import annotations

import os
from typing import Final

from infiniops_py import Constraint, OneOf, Requires

__all__ = ["PRIORITY", "base_constraints", "interpreting_on_cpu"]

PRIORITY: Final = 20


def interpreting_on_cpu() -> bool:
    """Whether the interpreter switch is on (see the module docstring)."""
    return os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("INFINIOPS_TRITON_INTERPRET_CPU") == "1"


def base_constraints() -> tuple[Constraint, ...]:
    """The device and import constraints every Triton implementation starts with."""
    devices = ("cuda", "cpu") if interpreting_on_cpu() else ("cuda",)
    return (
        OneOf("device_type", devices, fix="move the tensors to a CUDA device, or use the torch provider"),
        Requires("triton"),
    )

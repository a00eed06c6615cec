"""What the Triton provider's implementations share: devices, priority and the interpreter switch.

Users see a ``cuda``-only provider. For CI, the Triton interpreter runs kernels on CPU tensors: with both
``TRITON_INTERPRET=1`` and ``INFINIOPS_TRITON_INTERPRET_CPU=1`` set when the provider loads, ``cpu`` is
declared too (the conformance test sets both, for its own process only).
"""

from __future__ import annotations

import functools
import os
from typing import Final

import torch
import triton
import triton.language as tl

from infiniops_py import Constraint, OneOf, Requires

__all__ = [
    "INTERPRET", "PDL", "PRIORITY", "base_constraints", "cdiv", "interpreting_on_cpu", "next_power_of_2", "pdl",
    "pdl_start", "raw_stream", "sm_count",
]

PRIORITY: Final = 20
# Whether this process's kernels are the interpreter's: ``triton.jit`` decides it when a kernel module is imported
# (read once here, not per call: issue #25).
INTERPRET: Final = os.environ.get("TRITON_INTERPRET") == "1"


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints, as ``triton.cdiv`` (which in Triton 3.6 is a ``constexpr_function``: a few
    microseconds of Triton's jit machinery per host call, issue #25)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two ``>= n`` (0 for 0), as ``triton.next_power_of_2``, in plain int arithmetic."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


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


@functools.cache
def _sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """The SM count of the CUDA `device` (132 on the H200), read once per device."""
    return _sms(torch.cuda.current_device() if device.index is None else device.index)


def raw_stream(device: torch.device) -> int:
    """The current stream of `device` as the integer Triton's driver launches on (0 off CUDA), without the
    ``torch.cuda.Stream`` object ``torch.cuda.current_stream`` builds (issue #25: host cost per call)."""
    if device.type != "cuda":
        return 0
    index = device.index
    return torch._C._cuda_getCurrentRawStream(torch.cuda.current_device() if index is None else index)


# Programmatic dependent launch (sm90): a kernel launched with it may be scheduled while the kernel before it
# in the stream still runs, and waits on the device (griddepcontrol.wait) for that kernel's results before it
# touches memory; the kernels of a decode step then overlap one's launch with the previous one's tail, inside
# CUDA graphs too. Off unless INFINIOPS_TRITON_PDL=1 (module-level, so a benchmark can compare both); never
# under the interpreter.
PDL: bool = os.environ.get("INFINIOPS_TRITON_PDL") == "1" and os.environ.get("TRITON_INTERPRET") != "1"


def pdl() -> dict[str, bool]:
    """The launch keywords of a kernel that starts with `pdl_start`: its ``PDL`` constexpr and Triton's
    ``launch_pdl`` option, both `PDL`."""
    return {"PDL": PDL, "launch_pdl": PDL}


@triton.jit
def pdl_start(PDL: tl.constexpr):
    """First thing in a kernel launched with `pdl`: let the next kernel be scheduled, then wait for the previous
    one's results (nothing when `PDL` is off)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()

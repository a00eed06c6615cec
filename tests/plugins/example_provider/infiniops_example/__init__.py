"""A minimal provider plugin: ``add`` on the CPU in float32 and float16, without broadcasting.

The whole recipe of a third-party provider: implement the operator's calling convention (see
``infiniops_py/operators/add.py``), declare what it serves as a `Capability`, and return a `Provider`
from the ``infiniops_provider`` hook registered under the ``infiniops.providers`` entry point
(``pyproject.toml``). Then ``pytest --infiniops-provider example`` property-tests it against the
reference, and every problem outside the capability (bfloat16, cuda, broadcasting) is gated.
"""

from __future__ import annotations

import torch

from infiniops_py import Capability, Implementation, OneOf, Provider, hookimpl

__all__ = ["infiniops_provider"]

# Below torch (10): installing the example never changes what serves `add` by default.
PRIORITY = 5


def add(input: torch.Tensor, other: torch.Tensor, alpha: float, out: torch.Tensor) -> torch.Tensor:
    """``out = input + alpha * other`` for same-shape tensors (in place when ``out is input``)."""
    torch.add(input, other, alpha=alpha, out=out)
    return out


CAPABILITY = Capability(
    OneOf("device_type", ("cpu",), fix="use the torch provider on cuda"),
    OneOf("dtype", ("float32", "float16")),
    OneOf("broadcast", (False,), fix="expand other to input's shape first"),
)


@hookimpl
def infiniops_provider() -> Provider:
    return Provider(
        name="example",
        version="0.1.0",
        implementations=[Implementation("add", "example", "example.add", CAPABILITY, PRIORITY, add)],
    )

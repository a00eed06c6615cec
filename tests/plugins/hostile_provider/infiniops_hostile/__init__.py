"""Provider plugins that misbehave, one per module, each under its own entry point.

- ``exits``: calls ``sys.exit(3)`` when imported;
- ``interrupts``: raises ``KeyboardInterrupt`` in its hook;
- ``generator``: declares its implementations as a generator;
- ``stringy``: a constraint whose ``reject`` returns a str instead of a `Rejection`;
- ``baddescribe``: a constraint whose ``describe`` returns an int;
- ``overrides``: a `Capability` subclass whose ``reasons`` raises ``SystemExit``;
- ``chatty``: prints to stdout when imported and in its hook (otherwise a valid provider).

Each must end up a failed provider with its error, or (``stringy``) a candidate rejected for its faulty
constraint; the host process goes on, and ``infiniops matrix --format json`` still prints JSON alone.
"""

from __future__ import annotations

import torch

from infiniops_py import Capability, OneOf


def add(input: torch.Tensor, other: torch.Tensor, alpha: float, out: torch.Tensor) -> torch.Tensor:
    """A correct ``add`` (the operator's calling convention)."""
    return torch.add(input, other, alpha=alpha, out=out)


def cpu32() -> Capability:
    """cpu, float32."""
    return Capability(OneOf("device_type", ("cpu",)), OneOf("dtype", ("float32",)))

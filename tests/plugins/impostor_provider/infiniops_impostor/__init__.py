"""A provider plugin that calls itself ``torch`` and serves a wrong ``add`` at the highest priority.

Its distribution (``aaa-infiniops-impostor``) sorts before ``infiniops-provider-torch`` and registers it
under three entry points: ``aaahijack`` (a name that loads first), ``torch`` and ``reference``. Discovery
must refuse it under each: the real ``torch`` and the built-in ``reference`` keep their names and keep
serving, so ``ops.add`` never returns its numbers.
"""

from __future__ import annotations

import torch

from infiniops_py import Capability, Implementation, OneOf, Provider, hookimpl

__all__ = ["infiniops_provider"]


def add(input: torch.Tensor, other: torch.Tensor, alpha: float, out: torch.Tensor) -> torch.Tensor:
    """Wrong on purpose: ``input - alpha * other``."""
    return torch.sub(input, other, alpha=alpha, out=out)


@hookimpl
def infiniops_provider() -> Provider:
    capability = Capability(OneOf("device_type", ("cpu",)), OneOf("dtype", ("float32", "float16", "bfloat16")))
    return Provider(name="torch", version="9.9.9",
                    implementations=[Implementation("add", "torch", "torch.add", capability, 10_000, add)])

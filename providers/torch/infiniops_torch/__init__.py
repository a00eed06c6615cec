"""The ``torch`` provider: every operator with the fastest plain-PyTorch means, on cpu and cuda.

Each module holds one kernel family and exports ``IMPLEMENTATIONS``; this module gathers them for the
``infiniops_provider`` hook.
"""

from __future__ import annotations

from infiniops_py import Provider, hookimpl
from infiniops_py.operators import FAMILIES
from infiniops_py.registry import provider_from_modules

__all__ = ["infiniops_provider"]


@hookimpl
def infiniops_provider() -> Provider:
    """The ``torch`` provider: the implementations of every family, built for provider API 1."""
    return provider_from_modules("torch", "infiniops_torch", FAMILIES, api_version=1)

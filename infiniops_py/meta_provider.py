"""The built-in provider ``meta``: every operator on the ``meta`` device, for shapes alone.

A public call on meta tensors runs the whole contract (every shape, dtype, stride and overlap check; index
values are never read, there are none) and allocates its outputs on meta; this provider then has nothing
left to do. So a model can be traced for output shapes and contract errors without memory or kernels.
"""

from __future__ import annotations

from typing import Any

from infiniops_py.capability import Capability, OneOf
from infiniops_py.problem import SPECS
from infiniops_py.registry import Implementation, Provider

__all__ = ["provider"]

_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _shapes_only(*args: Any, **kwargs: Any) -> None:
    """Nothing to compute: the contract allocated the outputs on meta, which hold no values."""


def provider() -> Provider:
    capability = Capability(OneOf("device_type", ("meta",)), OneOf("dtype", _DTYPES))
    impls = [Implementation(spec.name, "meta", f"meta.{spec.name}", capability, 0, _shapes_only)
             for spec in SPECS.values()]
    return Provider(name="meta", version="", source="built into infiniops-py", implementations=impls)

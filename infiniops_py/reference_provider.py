"""The built-in last-resort provider ``reference``: each operator's literal PyTorch reference.

It serves every operator on cpu and cuda in every float dtype, at the lowest priority, and is what the
conformance suite compares against (on float64 CPU copies of the inputs).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from infiniops_py.capability import Capability, OneOf
from infiniops_py.problem import SPECS
from infiniops_py.registry import Implementation, Provider

__all__ = ["provider"]

_DTYPES = ("float16", "bfloat16", "float32", "float64")


def provider() -> Provider:
    try:
        ver = version("infiniops-py")
    except PackageNotFoundError:
        ver = "0+unknown"
    impls = [
        Implementation(
            op=spec.name,
            provider="reference",
            name=f"reference.{spec.name}",
            capability=Capability(OneOf("device_type", ("cpu", "cuda")), OneOf("dtype", _DTYPES)),
            priority=0,
            fn=spec.reference,
        )
        for spec in SPECS.values()
    ]
    return Provider(name="reference", version=ver, source="built into infiniops-py", implementations=impls)

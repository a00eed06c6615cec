"""Declares its implementations as a generator (used up by whoever reads it first)."""

from infiniops_hostile import add, cpu32
from infiniops_py import Implementation, Provider, hookimpl


@hookimpl
def infiniops_provider() -> Provider:
    impls = (Implementation("add", "generator", f"generator.add{n}", cpu32(), 1, add) for n in range(2))
    return Provider(name="generator", implementations=impls)  # type: ignore[arg-type]

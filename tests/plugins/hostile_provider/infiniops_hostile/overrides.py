"""A Capability subclass whose ``reasons`` (which the resolver calls) raises."""

from infiniops_hostile import add
from infiniops_py import Capability, Implementation, OneOf, Provider, hookimpl


class Sneaky(Capability):
    def reasons(self, problem, *, environment=True):  # type: ignore[no-untyped-def]
        raise SystemExit("sneaky")


@hookimpl
def infiniops_provider() -> Provider:
    capability = Sneaky(OneOf("device_type", ("cpu",)))
    return Provider(name="overrides",
                    implementations=[Implementation("add", "overrides", "overrides.add", capability, 1, add)])

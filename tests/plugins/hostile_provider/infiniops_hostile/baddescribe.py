"""A constraint whose ``describe`` returns an int (the matrix joins the descriptions as text)."""

from infiniops_hostile import add
from infiniops_py import Capability, Constraint, Implementation, OneOf, Provider, hookimpl


class Mute(Constraint):
    field = "broadcast"

    def reject(self, problem):  # type: ignore[no-untyped-def]
        return None

    def describe(self):  # type: ignore[no-untyped-def]
        return 5


@hookimpl
def infiniops_provider() -> Provider:
    capability = Capability(OneOf("device_type", ("cpu",)), OneOf("dtype", ("float32",)), Mute())
    return Provider(name="baddescribe",
                    implementations=[Implementation("add", "baddescribe", "baddescribe.add", capability, 1, add)])

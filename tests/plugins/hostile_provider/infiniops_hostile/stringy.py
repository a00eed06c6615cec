"""A constraint on the dtype whose ``reject`` returns a str: the matrix and the resolver call it."""

from infiniops_hostile import add
from infiniops_py import Capability, Constraint, Implementation, OneOf, Provider, hookimpl


class Stringy(Constraint):
    field = "dtype"

    def reject(self, problem):  # type: ignore[no-untyped-def]
        return "not today"

    def describe(self) -> str:
        return "stringy"


@hookimpl
def infiniops_provider() -> Provider:
    capability = Capability(OneOf("device_type", ("cpu",)), Stringy())
    return Provider(name="stringy", implementations=[Implementation("add", "stringy", "stringy.add", capability,
                                                                    10_000, add)])

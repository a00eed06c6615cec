"""A valid provider that prints to stdout when imported and in its hook."""

from infiniops_hostile import add, cpu32
from infiniops_py import Implementation, Provider, hookimpl

print("chatty: imported")


@hookimpl
def infiniops_provider() -> Provider:
    print("chatty: hook called")
    return Provider(name="chatty", implementations=[Implementation("add", "chatty", "chatty.add", cpu32(), 1, add)])

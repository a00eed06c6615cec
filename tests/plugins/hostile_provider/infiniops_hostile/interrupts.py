"""Raises KeyboardInterrupt in its hook."""

from infiniops_py import Provider, hookimpl


@hookimpl
def infiniops_provider() -> Provider:
    raise KeyboardInterrupt

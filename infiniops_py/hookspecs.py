"""The pluggy hook a provider plugin implements.

A provider distribution registers a module under the ``infiniops.providers`` entry-point group. That
module implements::

    from infiniops_py import Provider, hookimpl

    @hookimpl
    def infiniops_provider() -> Provider:
        return Provider(name="mine", version="1.0", implementations=[...], api_version=1)

registered as ``mine = my_package`` under that group: the provider's name must be the entry point's name,
or the plugin is refused (no plugin can take another provider's name). The hook runs once, with
``sys.stdout`` sent to stderr; whatever it raises makes the provider a failed one (see `plugins.load_plugin`).
"""

from __future__ import annotations

import pluggy

from infiniops_py.registry import Provider

__all__ = ["ENTRY_POINT_GROUP", "PROJECT", "PROVIDER_API", "hookimpl", "hookspec"]

# The provider API: the hook, `Provider`, `Implementation`, `Capability` and the calling conventions. A plugin
# states the version it was built for (``Provider(api_version=1)``); one built for another is refused at load.
PROVIDER_API = 1
PROJECT = "infiniops"
ENTRY_POINT_GROUP = "infiniops.providers"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def infiniops_provider() -> Provider:  # type: ignore[empty-body]
    """Return the provider: its name (the entry point's name), version and implementations (a list or tuple)."""

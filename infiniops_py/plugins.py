"""Provider discovery: pluggy over the ``infiniops.providers`` entry points, each plugin in isolation.

A plugin whose import or hook raises is kept as a `Provider` with its error, so that
``infiniops providers`` and the matrix can show it, and every other plugin still loads. So is a second
entry point under a provider name already taken (never silently dropped).

Environment:
    INFINIOPS_DISABLE_PLUGIN_AUTOLOAD=1: load no entry points (register plugins by hand).
    INFINIOPS_PROVIDERS=a,b: load only the entry points named (the built-in ``reference`` always loads).
"""

from __future__ import annotations

import importlib.metadata
import os
import traceback
from types import ModuleType
from typing import Any

import pluggy

from infiniops_py import hookspecs
from infiniops_py.registry import Provider

__all__ = ["discover", "load_plugin"]


def _plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def load_plugin(plugin: ModuleType | Any, *, name: str, source: str, version: str = "") -> Provider:
    """Register one plugin object with pluggy and call its hook, isolating any failure."""
    pm = _plugin_manager()
    try:
        pm.register(plugin, name=name)
        results = pm.hook.infiniops_provider()
        if not results:
            raise TypeError(f"plugin {name!r} implements no infiniops_provider hook")
        provider: Provider = results[0]
        if not isinstance(provider, Provider):
            raise TypeError(f"infiniops_provider() returned {type(provider).__name__}, not Provider")
    except Exception as exc:  # a broken plugin must not break the others
        return Provider(name=name, version=version, source=source, error=_summary(exc))
    provider.source = provider.source or source
    provider.version = provider.version or version
    return provider


def discover() -> list[Provider]:
    """Load every allowed entry point of the ``infiniops.providers`` group.

    Entry points load in order of name, then distribution. A second entry point with a name already
    taken is not loaded: it is kept as a failed provider (its name suffixed with its distribution, so
    both show) whose error names the distribution that provides the name first.
    """
    if os.environ.get("INFINIOPS_DISABLE_PLUGIN_AUTOLOAD", "") not in ("", "0"):
        return []
    allow = {n.strip() for n in os.environ.get("INFINIOPS_PROVIDERS", "").split(",") if n.strip()}
    providers: list[Provider] = []
    first: dict[str, str] = {}  # provider name -> the source that took it
    entry_points = importlib.metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP)
    for ep in sorted(entry_points, key=lambda e: (e.name, e.dist.name if e.dist else "")):
        if allow and ep.name not in allow:
            continue
        dist = ep.dist
        source = f"{dist.name} {dist.version} (entry point {ep.name} = {ep.value})" if dist else ep.value
        version = dist.version if dist else ""
        if ep.name in first:
            error = (f"duplicate provider name {ep.name!r}: also provided by {first[ep.name]}; "
                     "uninstall one of the two distributions or rename one entry point")
            name = f"{ep.name} [{dist.name if dist else ep.value}]"
            providers.append(Provider(name=name, version=version, source=source, error=error))
            continue
        first[ep.name] = source
        try:
            module = ep.load()
        except Exception as exc:  # a broken plugin must not break the others
            providers.append(Provider(name=ep.name, version=version, source=source, error=_summary(exc)))
            continue
        providers.append(load_plugin(module, name=ep.name, source=source, version=version))
    return providers


def _summary(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {last[0].filename}:{last[0].lineno})" if last else ""
    return f"{type(exc).__name__}: {exc}{where}"

"""Provider discovery: pluggy over the ``infiniops.providers`` entry points, each plugin in isolation.

A plugin whose import or hook raises is kept as a `Provider` with its error, so that
``infiniops providers`` and the matrix can show it, and every other plugin still loads. So is a second
entry point under a provider name already taken (never silently dropped), a second provider of a name
(`deduplicate`: the first one keeps serving), and a provider whose declarations are unusable
(`declaration_errors`: an unknown operator, a foreign provider name, a non-callable fn, a capability that
is not a `Capability`), which would otherwise only fail at call time.

Environment:
    INFINIOPS_DISABLE_PLUGIN_AUTOLOAD=1: load no entry points (register plugins by hand).
    INFINIOPS_PROVIDERS=a,b: load only the entry points named (the built-in ``reference`` always loads).
"""

from __future__ import annotations

import importlib.metadata
import os
import traceback
from collections.abc import Iterable
from types import ModuleType
from typing import Any

import pluggy

from infiniops_py import hookspecs
from infiniops_py.capability import Capability
from infiniops_py.operators import OPERATORS
from infiniops_py.registry import Implementation, Provider

__all__ = ["declaration_errors", "deduplicate", "discover", "duplicate", "load_plugin"]


def _plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def load_plugin(plugin: ModuleType | Any, *, name: str, source: str, version: str = "") -> Provider:
    """Register one plugin object with pluggy and call its hook, isolating any failure.

    Returns the plugin's `Provider`, or a failed one (no implementations, ``error`` set) when the hook is
    missing or raises, or when `declaration_errors` finds the declarations unusable.
    """
    pm = _plugin_manager()
    try:
        pm.register(plugin, name=name)
        results = pm.hook.infiniops_provider()
        if not results:
            raise TypeError(f"plugin {name!r} implements no infiniops_provider hook")
        provider: Provider = results[0]
        if not isinstance(provider, Provider):
            raise TypeError(f"infiniops_provider() returned {type(provider).__name__}, not Provider")
        errors = declaration_errors(provider)
    except Exception as exc:  # a broken plugin must not break the others
        return Provider(name=name, version=version, source=source, error=_summary(exc))
    provider.source = provider.source or source
    provider.version = provider.version or version
    if errors:
        return Provider(name=provider.name if _is_name(provider.name) else name, version=provider.version,
                        source=provider.source, error="invalid declarations: " + "; ".join(errors))
    return provider


def _is_name(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def declaration_errors(provider: Provider) -> list[str]:
    """What makes `provider` unusable, one fact per item; empty when it can be registered."""
    if not _is_name(provider.name):
        return [f"the provider's name is {provider.name!r}, not a non-empty str"]
    errors = []
    for n, impl in enumerate(provider.implementations):
        if not isinstance(impl, Implementation):
            errors.append(f"implementations[{n}] is {type(impl).__name__}, not an Implementation")
            continue
        what = f"implementation {impl.name!r}"
        if not isinstance(impl.op, str) or impl.op not in OPERATORS:
            errors.append(f"{what} is for unknown operator {impl.op!r} (known: {', '.join(OPERATORS)})")
        if impl.provider != provider.name:
            errors.append(f"{what} declares provider={impl.provider!r}, but it belongs to provider "
                          f"{provider.name!r}")
        if not callable(impl.fn):
            errors.append(f"{what}: fn is {type(impl.fn).__name__}, not callable")
        if not isinstance(impl.capability, Capability):
            errors.append(f"{what}: capability is {type(impl.capability).__name__}, not a Capability")
        if not isinstance(impl.priority, int) or isinstance(impl.priority, bool):
            errors.append(f"{what}: priority is {impl.priority!r}, not an int")
    return errors


def duplicate(provider: Provider, taken: Provider, origin: str = "") -> Provider:
    """`provider` refused because `taken` already has its name: a failed provider that names both.

    Its name gets `origin` appended (default: the first word of its source, the distribution), as in
    ``torch [manual]``, so that both show in ``infiniops providers``.
    """
    origin = origin or (provider.source.split(" ")[0] if provider.source else "unknown")
    error = (f"duplicate provider name {provider.name!r}: also provided by {taken.source or taken.name}; "
             "the first one keeps serving: give this one another name, or remove the other")
    return Provider(name=f"{provider.name} [{origin}]", version=provider.version, source=provider.source,
                    error=error)


def deduplicate(providers: Iterable[Provider]) -> list[Provider]:
    """`providers` with each name kept by its first holder; every later holder becomes a `duplicate`."""
    first: dict[str, Provider] = {}
    out = []
    for p in providers:
        taken = first.get(p.name)
        if taken is None:
            first[p.name] = p
            out.append(p)
        else:
            out.append(duplicate(p, taken))
    return out


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

"""Provider discovery: pluggy over the ``infiniops.providers`` entry points, each plugin in isolation.

A plugin is foreign code. Its import and its hook run with ``sys.stdout`` sent to stderr (machine output,
such as ``infiniops matrix --format json``, owns stdout), and whatever they raise, ``SystemExit`` and
``KeyboardInterrupt`` included, becomes the error of a failed `Provider`: ``infiniops providers`` and the
matrix show it, and every other plugin still loads. A plugin is refused the same way when:

- its provider's name is not its entry point's name (no plugin can take another provider's name);
- its entry point's name is already taken: the first in load order keeps it, and the clash is logged. Load
  order is by entry-point name, then distribution, except that the built-in ``reference`` and this project's
  ``torch``, ``triton`` and ``cupy`` (from their own distributions) always keep their names;
- a provider of its name is already registered (`deduplicate`: the first one keeps serving);
- its declarations are unusable (`declaration_errors`), which would otherwise only fail at call time.

Environment:
    INFINIOPS_DISABLE_PLUGIN_AUTOLOAD: a boolean (``1``/``0``, ``true``/``false``, ``yes``/``no``, ``on``/``off``);
        when true, load no entry points (register plugins by hand).
    INFINIOPS_PROVIDERS=a,b: load only the entry points named (the built-in ``reference`` always loads); a name
        that matches no entry point is listed as a failed provider that says so (names are case-sensitive).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import re
import sys
import traceback
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any, Final

import pluggy

from infiniops_py import hookspecs
from infiniops_py._env import env_flag, env_names
from infiniops_py._version import __version__
from infiniops_py.capability import Capability, Constraint
from infiniops_py.problem import SPECS
from infiniops_py.registry import Implementation, Provider

__all__ = ["OWNERS", "allow_list", "declaration_errors", "deduplicate", "discover", "duplicate", "load_plugin"]

log = logging.getLogger("infiniops")

# The provider names this project ships, and the distribution each must come from to keep its name.
OWNERS: Final = {"torch": "infiniops-provider-torch", "triton": "infiniops-provider-triton",
                 "cupy": "infiniops-provider-cupy"}
_BUILT_IN: Final = "reference"
_BUILT_INS: Final = (_BUILT_IN, "meta")  # the providers built into infiniops-py: names no plugin may take


def _plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


@contextlib.contextmanager
def _foreign_code() -> Iterator[None]:
    """Run a plugin's code with its prints on stderr: stdout carries machine output (``--format json``)."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def load_plugin(plugin: ModuleType | Any, *, name: str, source: str, version: str = "",
                check_name: bool = True) -> Provider:
    """Register one plugin object with pluggy and call its hook, isolating any failure.

    `name` is the entry point's name (or the name given to `runtime.register_provider`); with `check_name`,
    the provider must carry exactly that name. The hook and the checks of its declarations run with
    ``sys.stdout`` sent to stderr.

    Returns a new `Provider` built from the plugin's (so that the plugin cannot change it afterwards, and its
    implementations are a tuple), with `source` as its source (a plugin cannot pass for another
    distribution), or a failed one (no implementations, ``error`` set) named `name` when the
    hook is missing or raises anything (``SystemExit`` and ``KeyboardInterrupt`` included), when the provider
    names itself otherwise, or when `declaration_errors` finds the declarations unusable. Never raises.
    """
    pm = _plugin_manager()
    try:
        with _foreign_code():
            pm.register(plugin, name=name)
            results = pm.hook.infiniops_provider()
            if not results:
                raise TypeError(f"plugin {name!r} implements no infiniops_provider hook")
            found = _snapshot(results[0])  # checked and kept: what the plugin returns is read once
            errors = declaration_errors(found)
            if not errors and check_name and found.name != name:
                errors = [f"the provider is named {found.name!r}, but it is registered as {name!r}: a provider's "
                          "name must equal its entry point's name"]
            if not errors and found.api_version is not None and found.api_version != hookspecs.PROVIDER_API:
                return Provider(name=name, version=found.version or version, source=source, error=(
                    f"built for provider API {found.api_version!r}, but infiniops-py {__version__} has provider "
                    f"API {hookspecs.PROVIDER_API}: install a release of the provider built for it"))
            if errors:
                own = found.name if _is_name(found.name) and not check_name else name
                return Provider(name=own, version=version, source=source,
                                error="invalid declarations: " + "; ".join(errors))
            # the source is where discovery found the plugin, never what the plugin says of itself
            return Provider(name=found.name, version=found.version or version, source=source or found.source,
                            implementations=found.implementations, error=found.error,
                            api_version=found.api_version)
    except BaseException as exc:  # a plugin must not end the host, nor break the other plugins
        return Provider(name=name, version=version, source=source, error=_summary(exc))


def _snapshot(found: object) -> Provider:
    """A copy of the plugin's provider, each attribute read once, so that what is checked is what is kept
    (a list subclass or a property could answer the checks one way and the registry another)."""
    if type(found) is not Provider:
        raise TypeError(f"infiniops_provider() returned {type(found).__name__}, not Provider")
    impls = found.implementations
    if type(impls) in (list, tuple):
        impls = tuple(impls)
    return Provider(name=found.name, version=found.version, source=found.source, implementations=impls,
                    error=found.error, api_version=found.api_version)


def _is_name(value: object) -> bool:
    return type(value) is str and bool(value.strip())


def declaration_errors(provider: Provider) -> list[str]:
    """What makes `provider` unusable, one fact per item; empty when it can be registered.

    Checked: the name (a non-empty str); version, source and error (each a str); implementations (a list or
    tuple: a generator would be used up by its first reader); and each implementation: an `Implementation`
    (not a subclass) of a known operator, declaring this provider, with a name unique within the provider, a
    callable fn, an int priority, a bool graph_safe (``"no"`` would count as true), op and provider exactly
    str and priority exactly int (the resolver hashes, compares and sorts them: a subclass could answer
    otherwise than it answered the check, or raise), and a `Capability` (not a subclass: the resolver calls its
    methods) whose constraints are `Constraint` objects with a str ``field``, a bool ``environmental`` and a
    ``describe()`` that returns a str. A constraint's ``reject`` needs a problem to be checked: the resolver and
    the matrix turn one that raises or returns something other than a `Rejection` or None into a rejection of
    its own candidate (`capability.safe_reject`).

    Calls the constraints' ``describe()`` (plugin code): run it under `load_plugin`, which contains whatever
    escapes.
    """
    if not _is_name(provider.name):
        return [f"the provider's name is {provider.name!r}, not a non-empty str"]
    errors = []
    for attr in ("version", "source", "error"):
        value = getattr(provider, attr)
        if type(value) is not str:
            errors.append(f"the provider's {attr} is {type(value).__name__} {value!r}, not a str")
    impls = provider.implementations
    if type(impls) not in (list, tuple):
        return [*errors, f"implementations is a {type(impls).__name__}, not a list or tuple of Implementation"]
    names: set[str] = set()
    for n, impl in enumerate(impls):
        if type(impl) is not Implementation:  # a subclass could change what the registry reads
            errors.append(f"implementations[{n}] is {type(impl).__name__}, not an Implementation")
            continue
        what = f"implementation {impl.name!r}"
        if not _is_name(impl.name):
            what = f"implementations[{n}]"
            errors.append(f"{what}: name is {impl.name!r}, not a non-empty str")
        elif impl.name in names:
            errors.append(f"{what} appears twice: implementation names must be unique within a provider")
        else:
            names.add(impl.name)
        if type(impl.op) is not str:
            errors.append(f"{what}: op is {type(impl.op).__name__} {impl.op!r}, not a str")
        elif impl.op not in SPECS:
            errors.append(f"{what} is for unknown operator {impl.op!r} (known: {', '.join(SPECS)})")
        if type(impl.provider) is not str:
            errors.append(f"{what}: provider is {type(impl.provider).__name__} {impl.provider!r}, not a str")
        elif impl.provider != provider.name:
            errors.append(f"{what} declares provider={impl.provider!r}, but it belongs to provider "
                          f"{provider.name!r}")
        if not callable(impl.fn):
            errors.append(f"{what}: fn is {type(impl.fn).__name__}, not callable")
        if type(impl.capability) is not Capability:  # the resolver calls its methods: no overrides
            errors.append(f"{what}: capability is {type(impl.capability).__name__}, not a Capability (a plugin "
                          "extends capabilities with Constraint subclasses, not Capability ones)")
        else:
            errors.extend(f"{what}: {e}" for e in _capability_errors(impl.capability))
        if type(impl.priority) is not int:
            errors.append(f"{what}: priority is {type(impl.priority).__name__} {impl.priority!r}, not an int")
        if type(impl.graph_safe) is not bool:
            errors.append(f"{what}: graph_safe is {type(impl.graph_safe).__name__} {impl.graph_safe!r}, not a bool")
    return errors


def _capability_errors(capability: Capability) -> list[str]:
    """What makes the constraints of `capability` unusable (see `declaration_errors`)."""
    constraints = capability.constraints
    if not isinstance(constraints, tuple):
        return [f"capability.constraints is {type(constraints).__name__}, not a tuple of Constraint"]
    out = []
    for n, c in enumerate(constraints):
        what = f"constraint {n} ({type(c).__name__})"
        if not isinstance(c, Constraint):
            out.append(f"{what} is not a Constraint")
            continue
        if not isinstance(c.field, str):
            out.append(f"{what}: field is {type(c.field).__name__} {c.field!r}, not a str")
        if not isinstance(c.environmental, bool):
            out.append(f"{what}: environmental is {type(c.environmental).__name__}, not a bool")
        try:
            text = c.describe()
        except BaseException as exc:  # plugin code: its failure is a declaration error
            out.append(f"{what}: describe() raised {_summary(exc)}")
            continue
        if not isinstance(text, str):
            out.append(f"{what}: describe() returned {type(text).__name__} {text!r}, not a str")
    return out


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


def allow_list() -> tuple[str, ...]:
    """The entry-point names ``INFINIOPS_PROVIDERS`` allows (comma-separated); () when unset: all of them."""
    return env_names("INFINIOPS_PROVIDERS")


def _dist_name(ep: importlib.metadata.EntryPoint) -> str:
    """The normalized name of the distribution providing `ep` (PEP 503: lower case, runs of -_. as -)."""
    return re.sub(r"[-_.]+", "-", ep.dist.name).lower() if ep.dist else ""


def _load_order(ep: importlib.metadata.EntryPoint) -> tuple[str, bool, str]:
    """By name, the owner of a name this project ships first (see `OWNERS`), then by distribution."""
    dist = _dist_name(ep)
    return (ep.name, OWNERS.get(ep.name, dist) != dist, dist)


def discover() -> list[Provider]:
    """Load every allowed entry point of the ``infiniops.providers`` group.

    Entry points load in order of name, then distribution, except that this project's distributions load
    first under the names they ship (`OWNERS`). A second entry point with a name already taken (the
    built-in ``reference`` is taken from the start) is not loaded: it is kept as a failed provider (its name
    suffixed with its distribution, so both show) whose error names the source that holds the name, and the
    clash is logged. Each name in ``INFINIOPS_PROVIDERS`` that matches no entry point is kept as a failed
    provider saying so. Plugin modules are imported with ``sys.stdout`` sent to stderr; nothing a plugin
    raises escapes (see `load_plugin`).

    Raises:
        ValueError: ``INFINIOPS_DISABLE_PLUGIN_AUTOLOAD`` is neither true nor false (``1``/``0``, ``yes``/``no``,
            ...), naming the variable.
    """
    if env_flag("INFINIOPS_DISABLE_PLUGIN_AUTOLOAD"):
        return []
    allow = set(allow_list())
    providers: list[Provider] = []
    first = dict.fromkeys(_BUILT_INS, "the built-in provider of infiniops-py")  # name -> the source holding it
    entry_points = sorted(importlib.metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP), key=_load_order)
    for ep in entry_points:
        if allow and ep.name not in allow:
            continue
        dist = ep.dist
        source = f"{dist.name} {dist.version} (entry point {ep.name} = {ep.value})" if dist else ep.value
        version = dist.version if dist else ""
        if ep.name in first:
            error = (f"duplicate provider name {ep.name!r}: also provided by {first[ep.name]}, which keeps it; "
                     "uninstall one of the two distributions or rename one entry point")
            log.warning("infiniops: entry point %s refused: %s", source, error)
            name = f"{ep.name} [{dist.name if dist else ep.value}]"
            providers.append(Provider(name=name, version=version, source=source, error=error))
            continue
        first[ep.name] = source
        try:
            with _foreign_code():
                module = ep.load()
        except BaseException as exc:  # a plugin must not end the host, nor break the other plugins
            providers.append(Provider(name=ep.name, version=version, source=source, error=_summary(exc)))
            continue
        providers.append(load_plugin(module, name=ep.name, source=source, version=version))
    installed = sorted({ep.name for ep in entry_points})
    for name in sorted(allow - set(installed) - set(_BUILT_INS)):
        providers.append(Provider(name=name, source="INFINIOPS_PROVIDERS", error=(
            f"INFINIOPS_PROVIDERS names {name!r}, but no installed distribution has an entry point of that name "
            f"in group {hookspecs.ENTRY_POINT_GROUP} (installed: {', '.join(installed) or 'none'}; names are "
            "case-sensitive)")))
    return providers


def _summary(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {last[0].filename}:{last[0].lineno})" if last else ""
    try:
        text = str(exc)
    except BaseException:  # a plugin's exception may fail to print, too
        text = "(its message cannot be printed)"
    return f"{type(exc).__name__}{': ' + text if text else ''}{where}"

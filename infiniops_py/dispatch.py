"""The call path of every operator: the process-wide resolver and `dispatch`, which each public function calls.

Each operator's public function checks its arguments, builds the dispatch key ``(device_type, dtype, *field
values, *bucket classes)`` and calls `dispatch` by a plain import. `dispatch` looks the implementation up in the
resolver's cache (resolving the key on a miss), writes a trace line under ``INFINIOPS_TRACE_CALLS``, hands each
call to the observers of the current `observing` scopes and runs the implementation.

The resolver is built on the first call (nothing happens at import time) from the operators of
`infiniops_py.problem.SPECS`, the built-in ``reference`` and ``meta`` providers, the discovered plugins and the
providers registered by hand (`register_provider`); `reload` rebuilds it, re-reading the environment
(``INFINIOPS_*``). This module imports no operator module: the operators import it.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from infiniops_py import meta_provider, plugins, reference_provider
from infiniops_py.overrides import _OVERRIDES, Settings
from infiniops_py.problem import SPECS, OpSpec, dtype_name
from infiniops_py.registry import Implementation, Provider
from infiniops_py.resolver import Resolver

__all__ = [
    "Dispatched",
    "Observer",
    "dispatch",
    "get_resolver",
    "observing",
    "register_provider",
    "reload",
    "unregister_provider",
]

_resolver: Resolver | None = None
_manual: list[Provider] = []


class Dispatched(NamedTuple):
    """One implementation call, as an `observing` scope sees it once the implementation has returned.

    Attributes:
        spec: the operator. key: its dispatch key. impl: the implementation that ran.
        args, kwargs: the implementation's arguments (its calling convention; tensors of the call itself).
        returned: what the implementation returned (not necessarily what the public function returns).
    """

    spec: OpSpec
    key: tuple[Any, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    impl: Implementation
    returned: Any


Observer = Callable[[Dispatched], None]
_OBSERVERS: contextvars.ContextVar[tuple[Observer, ...]] = contextvars.ContextVar("infiniops_observers",
                                                                                 default=())


def _build() -> Resolver:
    settings = Settings.from_env()  # first: a bad switch stops before any plugin loads
    found = plugins.deduplicate([reference_provider.provider(), meta_provider.provider(), *plugins.discover(),
                                  *_manual])
    return Resolver(found, settings, SPECS)


def get_resolver() -> Resolver:
    """The current resolver, built on first use.

    Raises:
        ValueError: (`_env.EnvValueError`) a boolean ``INFINIOPS_*`` switch (``INFINIOPS_STRICT``,
            ``INFINIOPS_TRACE_CALLS``, ``INFINIOPS_DISABLE_PLUGIN_AUTOLOAD``) set to a value that is neither
            true nor false, naming the variable.
    """
    global _resolver
    if _resolver is None:
        _resolver = _build()
    return _resolver


def reload() -> Resolver:
    """Re-discover providers and re-read the environment; clears the resolution cache.

    Raises:
        ValueError: as `get_resolver`.
    """
    global _resolver
    _resolver = _build()
    return _resolver


def register_provider(plugin: Any, *, name: str | None = None) -> Provider:
    """Register a provider plugin object by hand (a module or object with an ``infiniops_provider`` hook).

    For use with ``INFINIOPS_DISABLE_PLUGIN_AUTOLOAD=1`` or in tests; returns the loaded `Provider`
    (check ``provider.error``). `name`, when given, must be the provider's own name, as an entry point's
    name must be; without it the provider keeps the name it gives itself. Nothing raises for a bad plugin
    (``SystemExit`` and ``KeyboardInterrupt`` from its hook included, see `plugins.load_plugin`): a missing or
    raising hook, a provider named otherwise than `name`, unusable declarations (see
    `plugins.declaration_errors`) or a provider name already taken (``torch``) give a failed provider,
    listed by ``infiniops providers``; the provider already holding the name keeps serving.
    """
    provider = plugins.load_plugin(plugin, name=name or _plugin_name(plugin), source="manual",
                                   check_name=name is not None)
    taken = get_resolver().providers.get(provider.name)
    if taken is not None:
        provider = plugins.duplicate(provider, taken, origin="manual")
    _manual.append(provider)
    reload()
    return provider


def _plugin_name(plugin: Any) -> str:
    """The plugin's ``__name__`` (a module's), or ``manual``: the name of its provider should it fail."""
    try:
        found = getattr(plugin, "__name__", None)
    except BaseException:  # a plugin object is foreign code, even its attributes
        found = None
    return found if isinstance(found, str) and found.strip() else "manual"


def unregister_provider(name: str) -> None:
    """Remove a provider registered by hand (and a duplicate of that name refused at registration)."""
    _manual[:] = [p for p in _manual if p.name not in (name, f"{name} [manual]")]
    reload()


def dispatch(spec: OpSpec, key: tuple[Any, ...], *args: Any, **kwargs: Any) -> Any:
    """Run ``impl.fn(*args, **kwargs)``, `impl` being the implementation the resolver picks for `key` under the
    current ``use(...)`` scopes, and return what it returns.

    `key` is ``(device_type, dtype, *field values, *bucket classes)`` in the order of ``spec.fields`` and
    ``spec.buckets``; `args` and `kwargs` follow the operator's implementation calling convention (its module
    documents it). A resolved key costs two contextvar reads and a dict lookup.

    Raises:
        GateError: no implementation serves the problem behind `key` (or strict mode forbids the fallback).
        ValueError: as `get_resolver`, when this call builds the resolver. Whatever the implementation, or an
            observer of an `observing` scope, raises.
    """
    r = _resolver or get_resolver()
    overrides = _OVERRIDES.get()
    impl = r.cache.get((spec.name, key, overrides))
    if impl is None:
        impl = r.resolve_key(spec, key, overrides)
    if r.settings.trace:
        _trace(spec, key, impl)
    observers = _OBSERVERS.get()
    if observers:
        return _observed(observers, Dispatched(spec, key, args, kwargs, impl, impl.fn(*args, **kwargs)))
    return impl.fn(*args, **kwargs)


def _observed(observers: tuple[Observer, ...], call: Dispatched) -> Any:
    for observer in observers:
        observer(call)
    return call.returned


@contextlib.contextmanager
def observing(observer: Observer) -> Iterator[None]:
    """Scope in which `observer` is called with a `Dispatched` for each implementation call, after the
    implementation returns (a call that raises is not observed), outer scopes' observers first.

    Scopes follow `contextvars`, as ``use(...)`` does: the calls of this thread are observed, and those of an
    asyncio task or a ``contextvars.copy_context().run`` started inside the block; another thread's calls are
    not (unless it runs in such a copy). Nothing is swapped process-wide, so scopes on several threads do not
    see each other's calls. What `observer` raises propagates from the operator call, after the implementation
    ran.
    """
    token = _OBSERVERS.set((*_OBSERVERS.get(), observer))
    try:
        yield
    finally:
        _OBSERVERS.reset(token)


def _trace(spec: OpSpec, key: tuple[Any, ...], impl: Implementation) -> None:
    record = {
        "operator_name": spec.name,
        "device_type": key[0],
        "dtype": dtype_name(key[1]),
        "provider": impl.provider,
        "implementation": impl.name,
    }
    if spec.buckets:  # the size bucket that the decision (and its measured times) belongs to
        record["bucket"] = dict(zip(spec.buckets, key[len(key) - len(spec.buckets):]))
    sys.stderr.write(json.dumps(record) + "\n")

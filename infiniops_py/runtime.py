"""The process-wide runtime: discovered providers, the resolver, the call path and tracing.

Built lazily on the first call (nothing happens at import time) and rebuilt by `reload()`, which also
re-reads the environment (``INFINIOPS_*``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from infiniops_py import plugins
from infiniops_py.operators import OPERATORS
from infiniops_py.operators._base import OpSpec, Problem, dtype_name, install_dispatcher
from infiniops_py.registry import Implementation, Provider
from infiniops_py.resolver import _OVERRIDES, Explanation, Fallback, Resolver, Settings, current_overrides

__all__ = [
    "explain",
    "fallbacks",
    "get_resolver",
    "make_problem",
    "providers",
    "register_provider",
    "reload",
    "resolve",
    "resolve_closure",
]

_resolver: Resolver | None = None
_manual: list[Provider] = []


def _build() -> Resolver:
    from infiniops_py import reference_provider

    found = [reference_provider.provider(), *plugins.discover(), *_manual]
    return Resolver(found, Settings.from_env(), OPERATORS)


def get_resolver() -> Resolver:
    """The current resolver, built on first use."""
    global _resolver
    if _resolver is None:
        _resolver = _build()
    return _resolver


def reload() -> Resolver:
    """Re-discover providers and re-read the environment; clears the resolution cache."""
    global _resolver
    _resolver = _build()
    return _resolver


def register_provider(plugin: Any, *, name: str | None = None) -> Provider:
    """Register a provider plugin object by hand (a module or object with an ``infiniops_provider`` hook).

    For use with ``INFINIOPS_DISABLE_PLUGIN_AUTOLOAD=1`` or in tests; returns the loaded `Provider`
    (check ``provider.error``).
    """
    provider = plugins.load_plugin(plugin, name=name or getattr(plugin, "__name__", "manual"), source="manual")
    _manual.append(provider)
    reload()
    return provider


def unregister_provider(name: str) -> None:
    """Remove a provider registered by hand."""
    _manual[:] = [p for p in _manual if p.name != name]
    reload()


def providers() -> list[Provider]:
    """Every provider the runtime knows, loaded or not."""
    return list(get_resolver().providers.values())


def make_problem(op: str, **fields: Any) -> Problem:
    """A problem for `op` from named fields (``device_type``, ``dtype``, ``head_dim``, ...).

    Raises:
        KeyError: an unknown operator. ValueError: an unknown field.
    """
    if op not in OPERATORS:
        raise KeyError(f"unknown operator {op!r}; known: {', '.join(sorted(OPERATORS))}")
    return OPERATORS[op].problem(**fields)


def _as_problem(op_or_problem: str | Problem, fields: Mapping[str, Any]) -> Problem:
    return op_or_problem if isinstance(op_or_problem, Problem) else make_problem(op_or_problem, **fields)


def explain(op: str | Problem, **fields: Any) -> Explanation:
    """The full ranking for one problem, without running anything: ``explain("rms_norm", device_type="cuda",
    dtype="bfloat16", hidden_size=4096)``. Honors the current ``use(...)`` scope."""
    return get_resolver().explain(_as_problem(op, fields), current_overrides())


def resolve(op: str | Problem, **fields: Any) -> Implementation:
    """The implementation that would serve a problem.

    Raises:
        GateError: nothing can serve it (or strict mode forbids the fallback).
    """
    return get_resolver().resolve(_as_problem(op, fields), current_overrides())


def resolve_closure(requests: Iterable[Problem | tuple[str, Mapping[str, Any]]]) -> dict[Problem, Implementation]:
    """Resolve every problem a model needs at once, before any weight loads.

    `requests` holds problems, or ``(op, fields)`` pairs. Returns the implementation per problem.

    Raises:
        GateError: one error listing every problem that no provider can serve.
    """
    problems = [r if isinstance(r, Problem) else make_problem(r[0], **r[1]) for r in requests]
    return get_resolver().resolve_closure(problems, current_overrides())


def fallbacks() -> list[Fallback]:
    """Every fallback resolution so far (since the last reload)."""
    return list(get_resolver().fallbacks)


def _dispatch(spec: OpSpec, key: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # the hot path of every call: a contextvar read and a dict lookup
    r = _resolver or get_resolver()
    overrides = _OVERRIDES.get()
    impl = r.cache.get((spec.name, key, overrides))
    if impl is None:
        impl = r.resolve_key(spec, key, overrides)
    if r.settings.trace:
        _trace(spec, key, impl)
    return impl.fn(*args, **kwargs)


def _trace(spec: OpSpec, key: tuple[Any, ...], impl: Implementation) -> None:
    record = {
        "operator_name": spec.name,
        "device_type": key[0],
        "dtype": dtype_name(key[1]),
        "provider": impl.provider,
        "implementation": impl.name,
    }
    sys.stderr.write(json.dumps(record) + "\n")


install_dispatcher(_dispatch)

"""The process-wide runtime: discovered providers, the resolver, the call path and tracing.

Built lazily on the first call (nothing happens at import time) and rebuilt by `reload()`, which also
re-reads the environment (``INFINIOPS_*``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from infiniops_py import plugins
from infiniops_py.problem import SPECS, OpSpec, Problem, dtype_name, install_dispatcher
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
    from infiniops_py import meta_provider, reference_provider

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


def providers() -> list[Provider]:
    """Every provider the runtime knows, loaded or not."""
    return list(get_resolver().providers.values())


def make_problem(op: str, **fields: Any) -> Problem:
    """A problem for `op` from named fields (``device_type``, ``dtype``, ``head_dim``, ...).

    Each field must have the type of its default in the operator's `OpSpec` (a bool field takes a bool,
    an int field an int, not a bool; a float field an int or a float; a str field a str), and an int
    field must be >= 0 unless its default is negative. ``device_type`` is a str, ``dtype`` a str or a
    ``torch.dtype``.

    Raises:
        KeyError: an unknown operator. ValueError: an unknown field, or a negative size.
        TypeError: `op` is not a str, or a field value of the wrong type (``head_dim=[64]``).
    """
    if not isinstance(op, str):
        raise TypeError(f"make_problem: the operator must be a str name, got {type(op).__name__} {op!r}")
    if op not in SPECS:
        raise KeyError(f"unknown operator {op!r}; known: {', '.join(sorted(SPECS))}")
    spec = SPECS[op]
    return spec.problem(**{name: _field_value(spec, name, value) for name, value in fields.items()})


_KINDS: tuple[tuple[type, str], ...] = ((bool, "a bool"), (int, "an int"), (float, "a float"), (str, "a str"))


def _field_value(spec: OpSpec, name: str, value: Any) -> Any:
    """`value` checked against the type of the field's default (see `make_problem`)."""
    if name == "device_type":
        if not isinstance(value, str):
            raise TypeError(f"{spec.name}: device_type={value!r} must be a str (cpu, cuda), got {type(value).__name__}")
        return value
    if name == "dtype":
        if not isinstance(value, (str, torch.dtype)):
            raise TypeError(f"{spec.name}: dtype={value!r} must be a str or a torch.dtype, got {type(value).__name__}")
        return value
    if name not in spec.fields:
        return value  # OpSpec.problem names the unknown field
    default = spec.fields[name]
    kind, what = next(((k, w) for k, w in _KINDS if isinstance(default, k)), (None, ""))
    if kind is None:
        try:
            hash(value)
        except TypeError:
            raise TypeError(f"{spec.name}: {name}={value!r} must be hashable, got {type(value).__name__}") from None
        return value
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok, value = True, float(value)
    if not ok:
        raise TypeError(f"{spec.name}: {name}={value!r} must be {what} (its default is {default!r}), "
                        f"got {type(value).__name__}")
    if kind is int and value < 0 <= default:
        raise ValueError(f"{spec.name}: {name}={value} must be >= 0")
    return value


def _as_problem(op_or_problem: str | Problem, fields: Mapping[str, Any]) -> Problem:
    if isinstance(op_or_problem, Problem):
        if fields:
            raise TypeError(f"got a Problem and fields {sorted(fields)}: pass one or the other")
        return op_or_problem
    return make_problem(op_or_problem, **fields)


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
        TypeError: a request that is neither a `Problem` nor an ``(op, fields)`` pair with a str `op` and a
            mapping of `fields`, or a field of the wrong type (see `make_problem`).
        KeyError, ValueError: an unknown operator or field, or a negative size (see `make_problem`).
    """
    return get_resolver().resolve_closure([_request(n, r) for n, r in enumerate(requests)], current_overrides())


def _request(n: int, request: Any) -> Problem:
    if isinstance(request, Problem):
        return request
    if not (isinstance(request, tuple | list) and len(request) == 2 and isinstance(request[0], str)
            and isinstance(request[1], Mapping)):
        raise TypeError(f"resolve_closure: request {n} is {request!r}: expected a Problem or an (op, fields) "
                        "pair, such as ('rms_norm', {'hidden_size': 4096})")
    return make_problem(request[0], **request[1])


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
    if spec.buckets:  # the size bucket that the decision (and its measured times) belongs to
        record["bucket"] = dict(zip(spec.buckets, key[len(key) - len(spec.buckets):]))
    sys.stderr.write(json.dumps(record) + "\n")


install_dispatcher(_dispatch)

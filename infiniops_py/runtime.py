"""The process-wide runtime's public face: problems by name, explanations, resolutions, the providers.

The resolver itself, its build (lazy, on the first call; nothing happens at import time), `reload()` (which
also re-reads the environment, ``INFINIOPS_*``), the providers registered by hand and the call path live in
`infiniops_py.dispatch`; `get_resolver`, `reload`, `register_provider` and `unregister_provider` are re-exported
here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from infiniops_py.dispatch import get_resolver, register_provider, reload, unregister_provider
from infiniops_py.problem import SPECS, OpSpec, Problem
from infiniops_py.registry import Implementation, Provider
from infiniops_py.resolver import Explanation, Fallback, current_overrides

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
    "unregister_provider",
]


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

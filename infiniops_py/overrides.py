"""Resolver settings and overrides: the environment's (`Settings`) and the scoped `use(...)` ones (`Override`).

``INFINIOPS_PRIORITY`` / ``INFINIOPS_DENY`` (``op=a,b;...`` or a bare ``a,b``), ``INFINIOPS_PROVIDERS`` (the
allow-list of plugins), the booleans ``INFINIOPS_STRICT`` and ``INFINIOPS_TRACE_CALLS``, and
``INFINIOPS_TUNING`` (where measured times come from, `infiniops_py.tuning.store`) are read when the runtime is
built; `use` scopes follow `contextvars`. How they rank candidates is the resolver's (`infiniops_py.resolver`).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from infiniops_py._env import env_flag, split_names
from infiniops_py.problem import SPECS

__all__ = ["Override", "Settings", "current_overrides", "use"]


def _per_op(text: str) -> dict[str | None, tuple[str, ...]]:
    """Parse ``op=a,b;op2=c`` (or a bare ``a,b`` for every operator)."""
    out: dict[str | None, tuple[str, ...]] = {}
    for part in text.replace("\n", ";").split(";"):
        if not part.strip():
            continue
        op, sep, names = part.partition("=")
        out[op.strip() if sep else None] = split_names(names if sep else op)
    return out


@dataclass(frozen=True)
class Settings:
    """Resolver settings from the environment (read when the runtime is built or reloaded)."""

    priority: Mapping[str | None, tuple[str, ...]] = field(default_factory=dict)
    deny: Mapping[str | None, tuple[str, ...]] = field(default_factory=dict)
    strict: bool = False
    trace: bool = False
    allow: tuple[str, ...] = ()  # INFINIOPS_PROVIDERS: the entry points allowed to load (empty: all)
    tuning: str = ""  # INFINIOPS_TUNING: empty (this machine's cache file), a tuning file, or off

    @classmethod
    def from_env(cls) -> Settings:
        """``INFINIOPS_PRIORITY``, ``INFINIOPS_DENY`` (both ``op=a,b;...`` or ``a,b``), ``INFINIOPS_PROVIDERS``
        (``a,b``), ``INFINIOPS_TUNING`` (a file, or ``off``), and the booleans ``INFINIOPS_STRICT`` and
        ``INFINIOPS_TRACE_CALLS`` (``1``/``0``, ``true``/``false``, ``yes``/``no``, ``on``/``off``; unset or
        empty is off); ``INFINIOPS_CHECK_INDICES`` is validated here too (the contracts read it).

        Raises:
            ValueError: a boolean variable set to anything else, naming the variable.
        """
        env = os.environ
        env_flag("INFINIOPS_CHECK_INDICES")  # read per call by the contracts; a bad value is refused here, first
        return cls(
            priority=_per_op(env.get("INFINIOPS_PRIORITY", "")),
            deny=_per_op(env.get("INFINIOPS_DENY", "")),
            strict=env_flag("INFINIOPS_STRICT"),
            trace=env_flag("INFINIOPS_TRACE_CALLS"),
            allow=split_names(env.get("INFINIOPS_PROVIDERS", "")),
            tuning=env.get("INFINIOPS_TUNING", ""),
        )

    def for_op(self, table: Mapping[str | None, tuple[str, ...]], op: str) -> tuple[str, ...]:
        return table.get(op, table.get(None, ()))


@dataclass(frozen=True)
class Override:
    """One ``use(...)`` scope: force `providers` (in order) and/or deny some, for `ops` (None: all)."""

    providers: tuple[str, ...] = ()
    ops: frozenset[str] | None = None
    deny: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # every dispatch inside the scope hashes the scopes in its cache key: hash the fields once
        object.__setattr__(self, "_hash", hash((self.providers, self.ops, self.deny)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined, no-any-return]

    def covers(self, op: str) -> bool:
        return self.ops is None or op in self.ops


_OVERRIDES: contextvars.ContextVar[tuple[Override, ...]] = contextvars.ContextVar("infiniops_use", default=())


def _names(argument: str, value: str | Sequence[str] | None) -> tuple[str, ...]:
    """One name or a sequence of names as a tuple; TypeError/ValueError name `argument` otherwise."""
    if value is None:
        return ()
    items = (value,) if isinstance(value, str) else value
    if isinstance(items, (bytes, Mapping)) or not isinstance(items, Iterable):
        raise TypeError(f"use({argument}={value!r}): expected a name (str) or a sequence of names, "
                        f"got {type(value).__name__}")
    names = tuple(items)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"use({argument}={value!r}): expected names as str, got {type(name).__name__} "
                            f"{name!r}")
        if not name.strip():
            raise ValueError(f"use({argument}={value!r}): an empty name")
    return names


def use(
    provider: str | Sequence[str] | None = None,
    *,
    op: str | Sequence[str] | None = None,
    deny: str | Sequence[str] | None = None,
) -> contextlib.AbstractContextManager[None]:
    """Scope in which `op` (one name, several, or all when None) is served only by `provider`.

    ``use(provider="triton", op="flash_attn_varlen")`` forces Triton for that operator (a problem Triton
    cannot serve raises `GateError`, it never falls back); ``use(provider=("triton", "torch"))`` allows
    those two, in that order; ``use(deny="cupy")`` excludes a provider. Scopes nest (the inner one wins)
    and follow `contextvars` (threads and asyncio tasks each see their own).

    Provider names are checked when a call resolves, not here (a provider may be registered inside the
    scope): forcing only providers that are not loaded raises `GateError` saying ``provider 'zzz' is not
    loaded (known: ...)``; a forced provider that is not loaded, or a denied one that does not exist, logs a
    warning once.

    Raises:
        TypeError: `provider`, `op` or `deny` is neither a str nor a sequence of str (``use(provider=5)``).
        ValueError: an unknown operator in `op` (the message lists the known ones), or an empty name.
    """
    names = _names("provider", provider)
    denied = _names("deny", deny)
    ops = None
    if op is not None:
        ops = frozenset(_names("op", op))
        unknown = sorted(ops - set(SPECS))
        if unknown:
            raise ValueError(f"use(op={op!r}): unknown operator(s) {', '.join(map(repr, unknown))} "
                             f"(known: {', '.join(SPECS)})")
        if not ops:
            raise ValueError(f"use(op={op!r}): names no operator (leave op out to cover every operator)")
    return _scope(Override(names, ops, denied))


@contextlib.contextmanager
def _scope(override: Override) -> Iterator[None]:
    token = _OVERRIDES.set((*_OVERRIDES.get(), override))
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


def current_overrides() -> tuple[Override, ...]:
    return _OVERRIDES.get()

"""The capability resolver: ranking, the per-problem cache, overrides, strict mode and fallbacks.

Ranking, for one problem:
1. Candidates are every implementation of the operator, less the denied ones (``INFINIOPS_DENY``,
   ``use(deny=...)``).
2. Inside a ``use(provider=...)`` scope that covers the operator, only the providers named are
   candidates, in the order given: forcing a provider never falls back to another one.
3. Otherwise the providers named by ``INFINIOPS_PRIORITY`` for the operator come first, in that order,
   then the rest by priority (highest first).
4. The first candidate whose capability accepts the problem wins.

Names are checked: ``use(op=...)`` raises on an unknown operator; an operator or provider named by the
environment that does not exist (or, for a priority, did not load) logs a warning once, when the resolver
is built; a provider forced by ``use(provider=...)`` that is not loaded, or one denied by ``use(deny=...)``
that does not exist, logs a warning once, and when nothing else is allowed the `GateError` says
``provider 'zzz' is not loaded (known: ...)``.

A *fallback* is a win by a candidate ranked below a preferred one that rejected the problem (a provider
named in ``INFINIOPS_PRIORITY``), or a win by the last-resort ``reference`` provider while another
provider implements the operator. Fallbacks are logged and recorded (`Resolver.fallbacks`); with
``INFINIOPS_STRICT=1`` they raise `GateError` instead.

The decision is cached per (operator, problem key, overrides), so a resolved call costs a dict lookup.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infiniops_py.errors import CandidateReport, GateError
from infiniops_py.operators import OPERATORS
from infiniops_py.operators._base import OpSpec, Problem
from infiniops_py.registry import Implementation, Provider

__all__ = ["Explanation", "Fallback", "Override", "Resolver", "Settings", "use"]

log = logging.getLogger("infiniops")
REFERENCE = "reference"


def _split(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _per_op(text: str) -> dict[str | None, tuple[str, ...]]:
    """Parse ``op=a,b;op2=c`` (or a bare ``a,b`` for every operator)."""
    out: dict[str | None, tuple[str, ...]] = {}
    for part in text.replace("\n", ";").split(";"):
        if not part.strip():
            continue
        op, sep, names = part.partition("=")
        out[op.strip() if sep else None] = _split(names if sep else op)
    return out


@dataclass(frozen=True)
class Settings:
    """Resolver settings from the environment (read when the runtime is built or reloaded)."""

    priority: Mapping[str | None, tuple[str, ...]] = field(default_factory=dict)
    deny: Mapping[str | None, tuple[str, ...]] = field(default_factory=dict)
    strict: bool = False
    trace: bool = False

    @classmethod
    def from_env(cls) -> Settings:
        """``INFINIOPS_PRIORITY``, ``INFINIOPS_DENY`` (both ``op=a,b;...`` or ``a,b``),
        ``INFINIOPS_STRICT=1`` and ``INFINIOPS_TRACE_CALLS=1``."""
        env = os.environ
        return cls(
            priority=_per_op(env.get("INFINIOPS_PRIORITY", "")),
            deny=_per_op(env.get("INFINIOPS_DENY", "")),
            strict=env.get("INFINIOPS_STRICT", "") not in ("", "0"),
            trace=env.get("INFINIOPS_TRACE_CALLS", "") not in ("", "0"),
        )

    def for_op(self, table: Mapping[str | None, tuple[str, ...]], op: str) -> tuple[str, ...]:
        return table.get(op, table.get(None, ()))


@dataclass(frozen=True)
class Override:
    """One ``use(...)`` scope: force `providers` (in order) and/or deny some, for `ops` (None: all)."""

    providers: tuple[str, ...] = ()
    ops: frozenset[str] | None = None
    deny: tuple[str, ...] = ()

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
        unknown = sorted(ops - set(OPERATORS))
        if unknown:
            raise ValueError(f"use(op={op!r}): unknown operator(s) {', '.join(map(repr, unknown))} "
                             f"(known: {', '.join(OPERATORS)})")
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


@dataclass(frozen=True)
class Fallback:
    """A resolution that did not get the preferred implementation."""

    problem: Problem
    chosen: str
    passed_over: tuple[CandidateReport, ...]

    def __str__(self) -> str:
        why = "; ".join(f"{c.provider}: " + ", ".join(map(str, c.rejections)) for c in self.passed_over)
        return f"{self.problem.op} {self.problem.describe()} fell back to {self.chosen} ({why})"


@dataclass(frozen=True)
class Explanation:
    """The full ranking for one problem, as `explain` returns it (nothing runs)."""

    problem: Problem
    candidates: tuple[CandidateReport, ...]
    chosen: Implementation | None
    fallback: Fallback | None
    note: str = ""  # what the overrides excluded, and forced providers that are not loaded

    def render(self) -> str:
        lines = [f"{self.problem.op} {self.problem.describe()}"]
        if self.note:
            lines.append(f"  note: {self.note}")
        for rank, c in enumerate(self.candidates, 1):
            mark = "chosen" if self.chosen is not None and c.implementation == self.chosen.name else (
                "accepts" if c.accepted else "rejects")
            lines.append(f"  {rank}. {c.provider} ({c.implementation}, priority {c.priority}): {mark}")
            if c.note:
                lines.append(f"       - {c.note}")
            lines.extend(f"       - {r}" for r in c.rejections)
        if self.chosen is None:
            lines.append("  no provider can serve this problem")
        elif self.fallback is not None:
            lines.append(f"  fallback: {self.fallback}")
        return "\n".join(lines)


class Resolver:
    """Picks implementations for problems from a fixed set of providers and settings."""

    def __init__(self, providers: Iterable[Provider], settings: Settings, specs: Mapping[str, OpSpec]) -> None:
        self.providers = {p.name: p for p in providers}
        self.settings = settings
        self.specs = specs
        self.by_op: dict[str, list[Implementation]] = {}
        for p in self.providers.values():
            for impl in p.implementations:
                self.by_op.setdefault(impl.op, []).append(impl)
        for impls in self.by_op.values():
            impls.sort(key=lambda i: (-i.priority, i.provider, i.name))
        self.cache: dict[tuple[Any, ...], Implementation] = {}
        self.fallbacks: list[Fallback] = []
        self._warned: set[str] = set()
        for message in self._settings_problems():
            self._warn_once(message)

    # -- names the overrides use ---------------------------------------------------------------------
    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning("infiniops: %s", message)

    def _loaded(self) -> str:
        return ", ".join(sorted(p.name for p in self.providers.values() if p.loaded))

    def _not_loaded(self, name: str) -> str | None:
        """Why provider `name` cannot serve anything, or None when it is loaded."""
        p = self.providers.get(name)
        if p is None:
            return f"provider {name!r} is not loaded (known: {self._loaded()})"
        if not p.loaded:
            return f"provider {name!r} is not loaded (it failed to load: {p.error})"
        return None

    def _settings_problems(self) -> list[str]:
        """Unknown operators and providers named by ``INFINIOPS_PRIORITY`` / ``INFINIOPS_DENY``."""
        out = []
        for var, table in (("INFINIOPS_PRIORITY", self.settings.priority), ("INFINIOPS_DENY", self.settings.deny)):
            for op, names in table.items():
                if op is not None and op not in self.specs:
                    out.append(f"{var}: unknown operator {op!r}, ignored (known: {', '.join(self.specs)})")
                    continue
                for name in names:
                    # denying a provider that failed to load is deliberate; naming one nobody knows is a typo
                    why = self._not_loaded(name) if var == "INFINIOPS_PRIORITY" or name not in self.providers else None
                    if why is not None:
                        out.append(f"{var}{f' for {op}' if op else ''}: {why}")
        return out

    # -- ranking ------------------------------------------------------------------------------------
    def _ranked(self, op: str, overrides: tuple[Override, ...]) -> tuple[list[Implementation], list[str], str]:
        """Candidates in order, the names of preferred providers, and a note on what was excluded."""
        impls = list(self.by_op.get(op, ()))
        denied = set(self.settings.for_op(self.settings.deny, op))
        forced: tuple[str, ...] = ()
        for ov in overrides:
            if ov.covers(op):
                denied.update(ov.deny)
                if ov.providers:
                    forced = ov.providers
        impls = [i for i in impls if i.provider not in denied]
        note = f"denied: {', '.join(sorted(denied))}" if denied else ""
        for ov in overrides:  # use(deny=...) of a provider that is not loaded: a typo, most likely
            for name in ov.deny if ov.covers(op) else ():
                if name not in self.providers:
                    self._warn_once(f"use(deny={name!r}): {self._not_loaded(name)}")
        if forced:
            order = {name: n for n, name in enumerate(forced)}
            kept = [i for i in impls if i.provider in order]
            kept.sort(key=lambda i: order[i.provider])
            left_out = sorted({i.provider for i in impls} - set(forced))
            if left_out:
                note = "; ".join(filter(None, (note, f"use(provider={forced}) excludes {', '.join(left_out)}")))
            missing = [why for why in map(self._not_loaded, forced) if why is not None]
            for why in missing:
                self._warn_once(f"use(provider={forced}): {why}")
            serving = {i.provider for i in self.by_op.get(op, ())}
            missing += [f"provider {name!r} implements no {op}" for name in forced
                        if name not in serving and self._not_loaded(name) is None]
            note = "; ".join(filter(None, (note, *missing)))
            return kept, list(forced), note
        preferred = list(self.settings.for_op(self.settings.priority, op))
        order = {name: n for n, name in enumerate(preferred)}
        impls.sort(key=lambda i: (order.get(i.provider, len(order)),))  # stable: priority order kept
        return impls, preferred, note

    def explain(self, problem: Problem, overrides: tuple[Override, ...] = ()) -> Explanation:
        """Rank every candidate for `problem`, pick one, and say why; runs nothing, raises nothing."""
        impls, preferred, note = self._ranked(problem.op, overrides)
        reports: list[CandidateReport] = []
        chosen: Implementation | None = None
        for impl in impls:
            rejections = impl.capability.reasons(problem)
            reports.append(CandidateReport(impl.provider, impl.name, impl.priority, rejections))
            if not rejections and chosen is None:
                chosen = impl
        fallback = None
        if chosen is not None:
            above = [r for r in reports[: impls.index(chosen)]]
            # passing over a sibling implementation of the chosen provider is no fallback
            passed = tuple(r for r in above if r.provider in preferred and r.provider != chosen.provider)
            others = {i.provider for i in self.by_op.get(problem.op, ())} - {REFERENCE}
            if passed or (chosen.provider == REFERENCE and others and not preferred):
                fallback = Fallback(problem, chosen.name, passed or tuple(above))
        return Explanation(problem, tuple(reports), chosen, fallback, note)

    def resolve(self, problem: Problem, overrides: tuple[Override, ...] = ()) -> Implementation:
        """The implementation for `problem`.

        Raises:
            GateError: no candidate accepts the problem, or strict mode forbids the fallback it needs.
        """
        ex = self.explain(problem, overrides)
        if ex.chosen is None:
            reports = list(ex.candidates)
            if ex.note:
                reports.append(CandidateReport("(excluded)", "-", 0, (), ex.note))
            raise GateError([(problem, reports)])
        if ex.fallback is not None:
            if self.settings.strict:
                raise GateError([(problem, list(ex.candidates))],
                                headline=f"INFINIOPS_STRICT=1 forbids this fallback: {ex.fallback}")
            self.fallbacks.append(ex.fallback)
            log.warning("infiniops fallback: %s", ex.fallback)
        return ex.chosen

    def resolve_key(self, spec: OpSpec, key: tuple[Any, ...], overrides: tuple[Override, ...]) -> Implementation:
        """Slow path of a call: build the problem behind `key`, resolve it, and cache the decision."""
        impl = self.resolve(spec.problem_from_key(key), overrides)
        self.cache[(spec.name, key, overrides)] = impl
        return impl

    def resolve_closure(
        self, requests: Iterable[Problem], overrides: tuple[Override, ...] = ()
    ) -> dict[Problem, Implementation]:
        """Resolve several problems at once; one `GateError` lists every gap.

        Raises:
            GateError: with one entry in ``gaps`` for each problem that cannot be served.
        """
        chosen: dict[Problem, Implementation] = {}
        gaps: list[tuple[Problem, list[CandidateReport]]] = []
        for problem in requests:
            try:
                chosen[problem] = self.resolve(problem, overrides)
            except GateError as err:
                gaps.extend(err.gaps)
        if gaps:
            raise GateError(gaps, headline=f"{len(gaps)} operator problem(s) of this configuration have no provider")
        return chosen
